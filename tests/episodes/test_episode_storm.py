"""Several writer processes, each with several envs, write episodes of random lengths
into one small ring (so it wraps and evicts all the time) while this process samples
transitions, n-step transitions, trajectories and whole episodes and checks every value
against the formula it was written from."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time

import numpy as np

import shmbuf
import pytest
from helpers import EPISODE_STORM, episode_storm_errors, episode_storm_writer, wait_for_file
from shmbuf.core import gather, native

pytestmark = pytest.mark.both_storages  # every test here runs on /dev/shm and on a file


def episode_storm(name: str, seconds: float, writers: int = 2, envs: int = 3, lane_capacity: int = 48,
                  killed: int = 0, tmp_path=None,
                  priority: float | None = None) -> tuple[dict[str, int], dict[str, int], list[int]]:
    """Returns (values checked per kind, errors per kind, steps written per writer).
    ``killed`` more writers (of ``envs`` envs each) write 5 steps and are SIGKILLed
    inside their sixth write, before the storm starts: their lanes end in rows reserved
    and never published. With ``priority``, a prioritized buffer, also sampled for
    sequences with burn-in drawn by priority (then given new priorities)."""
    ctx = mp.get_context("fork")
    lanes = (writers + killed) * envs
    checked = dict.fromkeys(["transition", "n-step", "trajectory", "episode"]
                            + (["sequence"] if priority else []), 0)
    errors = dict.fromkeys(checked, 0)
    finished = ctx.Array("q", 16 * (writers + killed), lock=False)
    with shmbuf.EpisodeBuffer.create(EPISODE_STORM, lanes * lane_capacity, lanes=lanes, name=name,
                                     seed=0, priority=priority) as buf:
        for k in range(killed):  # stopped at a chosen point, then killed there
            flag = str(tmp_path / f"killed-{k}")
            p = ctx.Process(target=episode_storm_writer, args=(name, writers + k, envs, 60.0, None, None,
                                                               ctx.Queue(), finished, 5, flag))
            p.start()
            wait_for_file(flag, p, "the writer to stop inside its write")
            os.kill(p.pid, signal.SIGKILL)
            p.join(30)
        ready, stop, results = ctx.Barrier(writers + 1), ctx.Event(), ctx.Queue()
        procs = [ctx.Process(target=episode_storm_writer, args=(name, w, envs, seconds, ready, stop, results,
                                                                finished))
                 for w in range(writers)]
        for p in procs:
            p.start()
        try:
            ready.wait(30)
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                try:
                    for kind, sample in (("transition", lambda: buf.sample(32)),
                                         ("n-step", lambda: buf.sample(32, n_step=3, gamma=0.5)),
                                         ("trajectory", lambda: buf.sample_trajectories(8, 6)),
                                         ("sequence", lambda: buf.sample_trajectories(8, 4, burn_in=3))):
                        if kind not in checked:
                            continue
                        before = finished[:]  # the episodes that ended before the call
                        batch = sample()
                        errors[kind] += episode_storm_errors(batch, "trajectory" if kind == "sequence" else kind,
                                                             3 if kind == "n-step" else 1, finished=before)
                        checked[kind] += len(batch["obs"])
                        if kind == "sequence":
                            errors[kind] += sequence_errors(buf, batch, 3)
                    for ep in buf.sample_episodes(2):
                        errors["episode"] += episode_storm_errors(ep, "episode")
                        checked["episode"] += 1
                except (ValueError, shmbuf.SampleTimeout):
                    continue  # nothing of that kind yet (the first moments)
        finally:
            stop.set()
            written = dict(results.get(timeout=60) for _ in procs)
            for p in procs:
                p.join(30)
        assert all(p.exitcode == 0 for p in procs)
    return checked, errors, [written[w] for w in range(writers)]


def sequence_errors(buf, batch, burn_in: int) -> int:
    """What a prioritized sequence batch gets wrong besides its values: the burn-in
    mask, the weights, the index (the last step's row); then it sets new priorities."""
    m = batch["mask"]
    bad = (batch["burn_in_mask"] != (m & (np.arange(m.shape[1]) < burn_in))).sum()
    bad += ((batch["weight"] <= 0) | (batch["weight"] > 1)).sum()
    bad += (batch["index"][:, 1] % buf.lane_capacity != batch["index"][:, 0] % buf.lane_capacity).sum()
    buf.update_priorities(batch["index"], 1.0 + (batch["obs"][:, -1, 0] % 7))
    return int(bad)


def test_episode_storm_returns_only_true_values(name, tmp_path):
    """Besides the writers, one writer was SIGKILLed inside a write: its lanes end in
    rows reserved and never published, and its episodes stay in progress for good."""
    checked, errors, written = episode_storm(name, seconds=4.0, killed=1, tmp_path=tmp_path)
    assert errors == dict.fromkeys(errors, 0), (errors, checked)
    assert min(checked.values()) > 0 and min(written) > 0, (checked, written)  # no throughput bound


def test_prioritized_sequences_with_burn_in_storm(name, tmp_path):
    """Sequences with burn-in drawn by priority, from a wrapping ring that writer
    processes fill while one lies SIGKILLed inside a write: every value, burn-in steps
    included, is the one written, and the masks, weights and indexes hold."""
    checked, errors, written = episode_storm(name, seconds=3.0, killed=1, tmp_path=tmp_path, priority=0.6)
    assert errors == dict.fromkeys(errors, 0), (errors, checked)
    assert min(checked.values()) > 0 and min(written) > 0, (checked, written)


def test_the_storm_sees_episodes_mixed_when_the_boundary_check_is_off(name, monkeypatch):
    """The protection matters: with the same-episode filter switched off, transitions
    straddle two episodes (or start at a final row) and the check above catches them."""
    real = gather.copy_windows

    def no_boundary(ring_, lane, first, length, lo, out, per_row=False, same=None, skip=None):
        return real(ring_, lane, first, length, lo, out, per_row)
    monkeypatch.setattr(gather, "copy_windows", no_boundary)  # the pure-Python path
    if native.available():
        native.extension().set_faults(4)  # the native path's segment check (this process only)
    try:
        checked, errors, _ = episode_storm(name, seconds=1.5)
    finally:
        if native.available():
            native.extension().set_faults(0)
    assert errors["transition"] > 0 and errors["n-step"] > 0, (errors, checked)
