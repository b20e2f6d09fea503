"""The storm of max_times_sampled (both paths: scripts/test runs this file on each): two
writers lap a small buffer (k=2) while three samplers sample it; samplers get SIGKILLs
and real SIGINTs at random instants and at chosen points of a count (killed ones are
replaced, interrupted ones go on); last, a sample is interrupted and stopped inside
its give-back, holding the lock, while the writers overwrite every row it counted
(they pause while it counts, so that its rows are in their slots when it gives back).
Counted across every sample any process returned and a final drain of what is left:
no row came out more than k times, none torn."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import random
import signal
import time

import numpy as np
import pytest

from helpers import counted_buffer, limited_sampler, limited_writer, returned_keys, storm_torn, wait_for_file
from shmbuf.limited import sampler as limited

import shmbuf

CTX = mp.get_context("fork")
K, CAPACITY, BATCH = 2, 64, 8
# chosen points: (where the sampler stops, what it gets there)
CHOSEN = [("counted", "SIGKILL"), ("released", "SIGKILL"), ("released", "SIGINT"), ("giving back", "SIGKILL")]


def lap(buf) -> None:
    """Wait until the writers wrote a lap of every lane (every slot holds a newer row)."""
    heads = buf.engine.heads().copy()
    deadline = time.monotonic() + 120
    while (buf.engine.heads() < heads + CAPACITY // 2).any():
        assert time.monotonic() < deadline, "the writers did not lap the buffer"
        time.sleep(0.01)


def storm(name: str, tmp_path, rounds: int = 8) -> dict:
    """Run the storm; what the logs and the drain prove (see the module)."""
    rnd = random.Random(0)
    stop, stop_writing = str(tmp_path / "stop"), str(tmp_path / "stop-writing")
    logs, samplers, writers = [], {}, []

    def start_sampler(hang: str = "", go: str = "") -> tuple[int, str]:
        s = len(logs)
        logs.append(str(tmp_path / f"s{s}.log"))
        flag = str(tmp_path / f"sflag{s}")
        p = CTX.Process(target=limited_sampler, args=(name, logs[s], stop, BATCH, hang, flag, go))
        p.start()
        samplers[s] = p
        return s, flag

    def end(s: int, sig: str) -> None:
        os.kill(samplers[s].pid, getattr(signal, sig))
        if sig == "SIGKILL":
            samplers.pop(s).join(30)
            start_sampler()

    def kill_the_rest():  # (a storm that fails leaves no process running)
        for p in writers + list(samplers.values()):
            if p.is_alive():
                p.kill()
                p.join(30)

    with counted_buffer(name, CAPACITY, K, lanes=2) as buf, contextlib.ExitStack() as cleanup:
        cleanup.callback(kill_the_rest)
        done = [str(tmp_path / f"done{w}") for w in range(2)]
        pause = str(tmp_path / "pause")
        writers += [CTX.Process(target=limited_writer, args=(name, w, 3, stop_writing, done[w], pause))
                    for w in range(2)]
        for p in writers:
            p.start()
        for _ in range(3):
            start_sampler()
        for r in range(rounds):
            point, sig = CHOSEN[r % len(CHOSEN)]
            s, flag = start_sampler(point)
            wait_for_file(flag, samplers[s], f"a sampler to stop at {point!r}", timeout=120)
            end(s, sig)
            for _ in range(2):  # random instants: a SIGKILL or a SIGINT, whatever the samplers do
                time.sleep(rnd.uniform(0, 0.03))
                sig = rnd.choice(["SIGKILL", "SIGINT"])
                ready = [s for s, p in samplers.items() if p.is_alive() and os.path.exists(logs[s])]
                if ready:  # (a SIGINT goes to samplers whose handler is in: they made their log)
                    end(rnd.choice(ready), sig)
        # last: the samplers killed and a lap written (no row counted), then, with the writers
        # paused, a sample interrupted at "released" stops inside its give-back (the lock
        # held, the rows it counted found in their slots) until the writers have overwritten
        # every row of their lanes and stopped
        for p in samplers.values():
            p.kill()
            p.join(30)
        samplers.clear()
        lap(buf)
        open(pause, "w").close()
        for d, p in zip(done, writers):
            wait_for_file(d, p, "a writer to pause", timeout=120)
        go = str(tmp_path / "go")
        s, flag = start_sampler("giving back", go)
        wait_for_file(flag, samplers[s], "a sampler to stop inside its give-back", timeout=120)
        for d in done:
            os.unlink(d)
        os.unlink(pause)
        lap(buf)
        open(stop_writing, "w").close()
        for d, p in zip(done, writers):
            wait_for_file(d, p, "a writer to stop writing", timeout=120)
        open(go, "w").close()
        for p in writers:
            p.join(120)
            assert p.exitcode == 0
        open(stop, "w").close()
        for p in samplers.values():
            p.join(120)
            assert p.exitcode == 0
        counts, torn = returned_keys(logs)
        returned = sum(counts.values())
        for _ in range(K * CAPACITY + 1):  # what is left comes out here, each row up to its count
            try:
                b = buf.sample(1, timeout=0.05)
            except shmbuf.SampleTimeout:
                break
            torn += storm_torn(b)
            key = int(b["a"][0, 0])
            counts[key] = counts.get(key, 0) + 1
        heads = buf.engine.heads().tolist()
    written = {w * 1_000_000_000 + i for w in range(2) for i in range(heads[w])}
    return {"over_k": sum(c > K for c in counts.values()), "most": max(counts.values(), default=0),
            "torn": torn, "returned": returned, "drained": sum(counts.values()) - returned,
            "unknown": len(set(counts) - written)}


def test_storm_no_row_comes_out_more_than_k_times(name, tmp_path):
    got = storm(name, tmp_path)
    assert got["over_k"] == 0 and got["torn"] == 0 and got["unknown"] == 0, got
    # (the rows held at the end come out k times each, to the last sampler or the drain)
    assert got["returned"] + got["drained"] >= K * CAPACITY, got


def test_the_storm_sees_rows_out_k_plus_1_times_without_the_give_backs_check(name, tmp_path, monkeypatch):
    """With the give-back's second check off (a count down that landed on a row written
    meanwhile stays), the sample stopped inside its give-back leaves counts of -1 and
    the drain gets those rows k+1 times: the storm sees it."""
    real = limited.Counts.give_back

    def unchecked(self):  # the give-back's second look at the stamps says "still there", always
        looks = []

        def published(lane, seq):
            looks.append(1)
            return type(self.engine).published(self.engine, lane, seq) if len(looks) == 1 else np.ones(len(seq), bool)
        self.engine.published = published
        try:
            real(self)
        finally:
            del self.engine.published

    monkeypatch.setattr(limited.Counts, "give_back", unchecked)  # (forked children inherit it)
    got = storm(name, tmp_path, rounds=1)
    assert got["over_k"] > 0, got
