"""Several writer processes, each with several envs, write episodes of random lengths
into one small ring (so it wraps and evicts all the time) while this process samples
transitions, n-step transitions, trajectories and whole episodes and checks every value
against the formula it was written from."""

from __future__ import annotations

import multiprocessing as mp
import time


import shmbuf
from helpers import EPISODE_STORM, episode_storm_errors, episode_storm_writer
from shmbuf import native, sampling


def episode_storm(name: str, seconds: float, writers: int = 2, envs: int = 3,
                  lane_capacity: int = 48) -> tuple[dict[str, int], dict[str, int], list[int]]:
    """Returns (values checked per kind, errors per kind, steps written per writer)."""
    ctx = mp.get_context("fork")
    lanes = writers * envs
    checked = dict.fromkeys(["transition", "n-step", "trajectory", "episode"], 0)
    errors = dict.fromkeys(checked, 0)
    with shmbuf.EpisodeBuffer.create(EPISODE_STORM, lanes * lane_capacity, lanes=lanes, name=name,
                                     seed=0) as buf:
        ready, stop, results = ctx.Barrier(writers + 1), ctx.Event(), ctx.Queue()
        procs = [ctx.Process(target=episode_storm_writer, args=(name, w, envs, seconds, ready, stop, results))
                 for w in range(writers)]
        for p in procs:
            p.start()
        try:
            ready.wait(30)
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                try:
                    for kind, batch in (("transition", buf.sample(32)),
                                        ("n-step", buf.sample(32, n_step=3, gamma=0.5)),
                                        ("trajectory", buf.sample_trajectories(8, 6))):
                        errors[kind] += episode_storm_errors(batch, kind, 3 if kind == "n-step" else 1)
                        checked[kind] += len(batch["obs"])
                    for ep in buf.sample_episodes(2):
                        errors["episode"] += episode_storm_errors(ep, "episode")
                        checked["episode"] += 1
                except (ValueError, sampling.SampleTimeout):
                    continue  # nothing of that kind yet (the first moments)
        finally:
            stop.set()
            written = dict(results.get(timeout=60) for _ in procs)
            for p in procs:
                p.join(30)
        assert all(p.exitcode == 0 for p in procs)
    return checked, errors, [written[w] for w in range(writers)]


def test_episode_storm_returns_only_true_values(name):
    checked, errors, written = episode_storm(name, seconds=4.0)
    assert errors == dict.fromkeys(errors, 0), (errors, checked)
    assert min(checked.values()) > 0 and min(written) > 0, (checked, written)  # no throughput bound


def test_the_storm_sees_episodes_mixed_when_the_boundary_check_is_off(name, monkeypatch):
    """The protection matters: with the same-episode filter switched off, transitions
    straddle two episodes (or start at a final row) and the check above catches them."""
    real = sampling.copy_windows

    def no_boundary(ring_, lane, first, length, lo, out, per_row=False, same=None, skip=None):
        return real(ring_, lane, first, length, lo, out, per_row)
    monkeypatch.setattr(sampling, "copy_windows", no_boundary)  # the pure-Python path
    if native.available():
        native._native.set_faults(4)  # the native path's segment check (this process only)
    try:
        checked, errors, _ = episode_storm(name, seconds=1.5)
    finally:
        if native.available():
            native._native.set_faults(0)
    assert errors["transition"] > 0 and errors["n-step"] > 0, (errors, checked)
