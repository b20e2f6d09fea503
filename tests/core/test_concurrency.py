"""Concurrent writers and samplers, and processes killed at every point of a write."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time

import numpy as np
import psutil
import pytest

import shmbuf
from shmbuf.core import native
from helpers import (STORM, claim_and_exit, storm_rows, storm_torn, storm_writer, writers_and_samplers,
                     start_hanging_writer, wait_for_file, write_and_hang)

pytestmark = pytest.mark.both_storages  # every test here runs on /dev/shm and on a file


def storm(name: str, seconds: float, capacity: int = 64, chunks=(7, 1), lanes: int = 1,
          stop_when_torn: bool = False, pause: float = 0.0,
          pure: tuple[bool, ...] = ()) -> tuple[int, int, list[int]]:
    """Writers hammer a tiny ring while this process samples and checks every row.
    ``pure[i]``: writer i runs the pure-Python path. Returns (rows checked, torn rows,
    rows written by each writer)."""
    ctx = mp.get_context("fork")
    with shmbuf.Buffer.create(STORM, capacity, lanes=lanes, name=name, seed=0) as buf:
        ready, stop, results = ctx.Barrier(len(chunks) + 1), ctx.Event(), ctx.Queue()
        procs = [ctx.Process(target=storm_writer, args=(name, w, c, seconds, ready, stop, results, pause,
                                                              w < len(pure) and pure[w]))
                 for w, c in enumerate(chunks)]
        for p in procs:
            p.start()
        ready.wait(30)
        checked = torn = 0
        deadline = time.monotonic() + seconds
        out = buf.empty_batch(64)
        while time.monotonic() < deadline:
            if len(buf) < min(8, capacity):
                continue
            try:
                buf.sample(64, out=out)
                torn += storm_torn(out)
                seqs = buf.sample_sequences(4, min(3, capacity // 2))
                torn += storm_torn({k: v.reshape((-1,) + v.shape[2:]) for k, v in seqs.items()})
            except ValueError:
                # with the protection broken, writers may leave every row without its
                # published stamp; with it, this never happens (no writer dies here)
                if stop_when_torn:
                    if torn:
                        break
                    continue
                raise
            checked += 64 + 12
            if stop_when_torn and torn:
                break
        stop.set()
        written = dict(results.get(timeout=60) for _ in procs)
        for p in procs:
            p.join(30)
            assert p.exitcode == 0
    return checked, torn, [written[w] for w in range(len(chunks))]


def test_overwrite_storm_has_no_torn_rows(name):
    checked, torn, written = storm(name, seconds=3.0)
    assert torn == 0
    assert checked > 0 and min(written) > 0, (checked, written)  # no throughput bound: shared CI


@pytest.mark.skipif(not native.available(), reason="needs the C extension")
@pytest.mark.parametrize("slow", [False, True], ids=["storm", "slow storm"])
def test_native_and_pure_python_writers_share_one_lane(name, slow):
    """One lane, writers on both paths at once: they serialise their reservations on
    the same lock and wait for each other's rows in the same table."""
    kw = dict(SLOW_STORM, chunks=(1, 2, 1)) if slow else dict(chunks=(7, 1, 3))
    checked, torn, written = storm(name, seconds=3.0, pure=(False, True, False), **kw)
    assert torn == 0 and checked > 0 and min(written) > 0


def test_overwrite_storm_with_lanes(name):
    checked, torn, written = storm(name, seconds=1.5, capacity=32, chunks=(5, 3), lanes=2)
    assert torn == 0 and checked > 0 and min(written) > 0


def test_several_sampler_processes_at_once(name):
    """Two sampler processes and two writers at once: nobody blocks, nothing is torn."""
    ctx = mp.get_context("forkserver")
    with shmbuf.Buffer.create(STORM, 64, name=name, seed=0) as buf:
        buf.extend(storm_rows(9, np.arange(64)))
        samplers, writers = writers_and_samplers(name, ctx)
        assert all(checked > 0 and torn == 0 for checked, torn in samplers), samplers
        assert all(rows > 0 for rows in writers), writers


def test_storm_detects_tears_when_the_stamp_check_is_off(name, break_protection):
    """The storm test is only worth something if it sees tears without the protection."""
    break_protection("stamp check")
    _, torn, _ = storm(name, seconds=20.0, stop_when_torn=True)
    assert torn > 0


SLOW_STORM = dict(capacity=2, chunks=(1, 2, 1), pause=0.002)
"""A 2-slot ring, three writers that pause between fields: writers wrap onto each
other's slots while the older ones are still copying, all the time."""


def test_slow_overlapping_writers_on_a_tiny_ring_tear_nothing(name):
    checked, torn, written = storm(name, seconds=3.0, **SLOW_STORM)
    assert torn == 0 and checked > 0 and min(written) > 0


def test_the_slow_storm_catches_writers_that_do_not_wait(name, break_protection):
    """Break the protection on purpose (wrapping writers never wait for older ones):
    the storm must see torn rows, or it proves nothing."""
    break_protection("waiting")
    _, torn, _ = storm(name, seconds=20.0, stop_when_torn=True, **SLOW_STORM)
    assert torn > 0


def test_threads_share_a_handle(name):
    with shmbuf.Buffer.create(STORM, 48, name=name, seed=1) as buf:
        stop = threading.Event()
        errors: list[BaseException] = []

        def write(w):
            try:
                seq = 0
                while not stop.is_set():
                    buf.extend(storm_rows(w, np.arange(seq, seq + 5)))
                    seq += 5
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)
        threads = [threading.Thread(target=write, args=(w,)) for w in range(3)]
        for t in threads:
            t.start()
        torn = checked = 0
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            if len(buf):
                torn += storm_torn(buf.sample(32))
                checked += 32
        stop.set()
        for t in threads:
            t.join(30)
        assert not errors and torn == 0 and checked > 0


@pytest.mark.parametrize("point", ["locked", "reserved", "writing"])
def test_writer_killed_mid_write_blocks_nobody(name, tmp_path, point):
    """SIGKILL a writer while it holds the lock, between reserve and publish, and in the
    middle of its copy. Others keep writing and sampling; its rows are never sampled."""
    with shmbuf.Buffer.create({"x": ((), "int64")}, 8, name=name, seed=0, timeout=5) as buf:
        buf.extend({"x": np.arange(3)})
        proc = start_hanging_writer(name, point, tmp_path)
        proc.kill()
        proc.join(30)  # reaped here; test_zombie_writer covers the unreaped case
        t0 = time.monotonic()
        for i in range(3, 40):  # wraps the 8-slot ring over the dead writer's slots 4 times
            buf.add({"x": i}, timeout=5)
            assert 10_000 not in buf.sample(64, timeout=5)["x"]
        assert time.monotonic() - t0 < 10
        rows = buf.sample(500)["x"]
        assert rows.max() < 10_000 and set(rows.tolist()) <= set(range(3, 40))
        assert buf.sample_sequences(50, 3)["x"].max() < 10_000


def test_dead_writers_slots_are_never_sampled_before_the_wrap(name, tmp_path):
    with shmbuf.Buffer.create({"x": ((), "int64")}, 16, name=name, seed=0) as buf:
        buf.extend({"x": np.arange(3)})
        proc = start_hanging_writer(name, "writing", tmp_path)
        proc.kill()
        proc.join(30)
        buf.extend({"x": np.arange(7, 10)})  # rows after the dead writer's 4 slots
        assert len(buf) == 10  # the dead writer's 4 reserved rows still count in len
        got = buf.sample(3000)["x"]
        assert set(got.tolist()) == {0, 1, 2, 7, 8, 9}
        windows = {tuple(w) for w in buf.sample_sequences(500, 2)["x"].tolist()}
        assert windows == {(0, 1), (1, 2), (7, 8), (8, 9)}  # never across the hole


def test_zombie_writer_counts_as_dead(name, tmp_path):
    """Killed but not reaped yet: its pid still exists, as a zombie."""
    with shmbuf.Buffer.create({"x": ((), "int64")}, 4, name=name, timeout=5) as buf:
        proc = start_hanging_writer(name, "writing", tmp_path)
        os.kill(proc.pid, signal.SIGKILL)
        while psutil.Process(proc.pid).status() != psutil.STATUS_ZOMBIE:  # dead; not joined yet
            time.sleep(0.01)
        for i in range(10):
            buf.add({"x": i}, timeout=5)
        assert set(buf.sample(200)["x"].tolist()) == {6, 7, 8, 9}
        proc.join(30)


def test_sample_of_only_dead_rows_raises_instead_of_hanging(name, tmp_path):
    with shmbuf.Buffer.create({"x": ((), "int64")}, 8, name=name) as buf:
        proc = start_hanging_writer(name, "reserved", tmp_path)
        proc.kill()
        proc.join(30)
        assert len(buf) == 4
        with pytest.raises(ValueError, match="no published rows"):
            buf.sample(1, timeout=5)


def test_stopped_lock_holder_gives_a_timeout_not_a_hang(name, tmp_path):
    with shmbuf.Buffer.create({"x": ((), "int64")}, 8, name=name) as buf:
        proc = start_hanging_writer(name, "locked", tmp_path)
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            with pytest.raises(shmbuf.LockTimeout, match=f"last taken by pid {proc.pid}"):
                buf.add({"x": 1}, timeout=0.3)
            assert time.monotonic() - t0 < 5
            assert len(buf) == 4  # the stopped writer's reservation; ours never happened
        finally:
            proc.kill()
            proc.join(30)
        buf.add({"x": 1}, timeout=5)  # the kernel released the dead holder's lock


def test_live_slow_writer_makes_a_wrapping_writer_wait_then_time_out(name, tmp_path):
    with shmbuf.Buffer.create({"x": ((), "int64")}, 4, name=name) as buf:
        proc = start_hanging_writer(name, "writing", tmp_path)  # alive, holds slots 0..3
        try:
            with pytest.raises(shmbuf.WriteTimeout, match=f"process\\(es\\) \\[{proc.pid}\\]"):
                buf.add({"x": 1}, timeout=0.3)
        finally:
            proc.kill()
            proc.join(30)
        buf.add({"x": 2}, timeout=5)
        assert buf.sample(50)["x"].tolist() == [2] * 50


def _fork_then_hold_lock(name, flag, child_pid_file):
    """Attach, fork a long-lived child (it inherits our descriptors), then take the lock
    and stop there. If the lock lived on a shared descriptor, killing us would not free it."""
    held = shmbuf.Buffer.attach(name)  # its lock descriptor is what the child inherits
    pid = os.fork()
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    with open(child_pid_file, "w") as f:
        f.write(str(pid))
    write_and_hang(name, "locked", flag)
    held.close()  # not reached: write_and_hang stops for good


def test_lock_is_released_even_if_the_holder_forked(name, tmp_path):
    flag, child_file = tmp_path / "flag", tmp_path / "child"
    with shmbuf.Buffer.create({"x": ((), "int64")}, 8, name=name) as buf:
        proc = mp.get_context("spawn").Process(target=_fork_then_hold_lock,
                                               args=(name, str(flag), str(child_file)))
        proc.start()
        wait_for_file(flag, proc)
        grandchild = int(child_file.read_text())
        try:
            proc.kill()
            buf.add({"x": 1}, timeout=5)  # would time out if the grandchild kept the lock
        finally:
            os.kill(grandchild, signal.SIGKILL)  # it also holds proc's sentinel: kill it first
            proc.join(30)


def test_dead_processes_lane_can_be_claimed_again(name):
    ctx = mp.get_context("spawn")
    with shmbuf.Buffer.create({"x": ((), "int64")}, 4, lanes=2, name=name) as buf:
        q = ctx.Queue()
        p = ctx.Process(target=claim_and_exit, args=(name, q))
        p.start()
        assert q.get(timeout=60) == 0
        p.join(30)
        assert p.exitcode == -signal.SIGKILL
        assert buf.claim_lane() == 0  # 1 if the dead process still held lane 0


def test_full_reservation_table_of_dead_writers_is_reclaimed(name):
    """Entries left by writers killed mid-write are taken back when none is free."""
    import subprocess
    import sys

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(30)
    with shmbuf.Buffer.create({"x": ((), "int64")}, 8, name=name) as buf:
        res = buf.engine.ring.res
        res[:, 0] = dead.pid  # every entry held by a process that has exited
        res[:, 2] = 0
        res[:, 3] = 10**6  # far ahead: overlaps nothing anyone waits for
        res[:, 4] = 1
        buf.add({"x": 7}, timeout=5)
        assert buf.sample(5)["x"].tolist() == [7] * 5
        assert (res[:, 0] == 0).sum() >= len(res) - 1
