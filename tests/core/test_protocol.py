"""Deterministic tests of the write protocol's corner cases: processes stopped at a
chosen point (the write hook), killed, or interrupted, then checked exactly."""

from __future__ import annotations

import fcntl
import multiprocessing as mp
import os
import random
import signal
import threading
import time

import pytest

import shmbuf
from shmbuf.core import ring
from helpers import add_through_interrupts, start_hanging_writer, wait_for_file

pytestmark = pytest.mark.both_storages  # every test here runs on /dev/shm and on a file


def _stop(*procs):
    for p in procs:
        p.kill()
        p.join(30)


@pytest.mark.parametrize("middle", ["died", "gave up"])
def test_a_writer_waits_for_a_live_writer_two_laps_back(name, tmp_path, middle):
    """Capacity 1: A is alive and copying row 0. The writer of row 1 died after
    reserving (or gave up with WriteTimeout). Row 2's writer must still wait for A, or
    it would publish while A keeps copying into the same slot (a torn row)."""
    with shmbuf.Buffer.create({"x": ((), "int64")}, 1, name=name, seed=0) as buf:
        a = start_hanging_writer(name, "writing", tmp_path, rows=1, tag="a")
        try:
            if middle == "died":
                b = start_hanging_writer(name, "reserved", tmp_path, rows=1, tag="b")
                _stop(b)
            else:
                with pytest.raises(shmbuf.WriteTimeout):
                    buf.add({"x": 1}, timeout=0.2)  # waits for A, gives up, frees its entry
            with pytest.raises(shmbuf.WriteTimeout, match=f"live process\\(es\\) \\[{a.pid}\\]"):
                buf.add({"x": 2}, timeout=0.3)
        finally:
            _stop(a)
        buf.add({"x": 3}, timeout=5)  # A is dead now: nothing to wait for
        assert buf.sample(20)["x"].tolist() == [3] * 20


def test_a_waiting_writer_notices_that_the_writer_it_waits_for_was_killed(name, tmp_path):
    with shmbuf.Buffer.create({"x": ((), "int64")}, 4, name=name, seed=0) as buf:
        a = start_hanging_writer(name, "writing", tmp_path, rows=4)  # alive, holds slots 0..3
        result = {}

        def wrap():
            try:
                buf.add({"x": 7}, timeout=120)  # wraps onto A's slots: waits for A
                result["ok"] = time.monotonic()
            except BaseException as exc:  # pragma: no cover - reported below
                result["error"] = exc

        t = threading.Thread(target=wrap)
        t.start()
        time.sleep(0.3)
        assert t.is_alive(), "the wrapping writer did not wait for the live one"
        killed = time.monotonic()
        _stop(a)
        t.join(60)  # far below the add's own 120 s timeout
        assert not t.is_alive() and "error" not in result, result
        assert result["ok"] - killed < 60
        assert buf.sample(10)["x"].tolist() == [7] * 10


@pytest.mark.parametrize("point", ["note", "locked", "reserved", "writing"])
def test_ctrl_c_at_any_point_of_a_write_leaves_nothing_held(name, point, monkeypatch, set_hook):
    """KeyboardInterrupt while holding the lock (in the holder note or the critical
    section), between reserving and writing, and mid-copy: the process goes on (a
    notebook), and neither it nor anybody else is blocked; the rows are never sampled."""
    with shmbuf.Buffer.create({"x": ((), "int64"), "y": ((), "int64")}, 4, name=name, seed=0) as buf, \
            shmbuf.Buffer.attach(name) as other:
        def interrupt(where):
            if where == point:
                raise KeyboardInterrupt

        if point == "note":
            if buf.native:
                pytest.skip("the native path takes the lock without running Python code")
            monkeypatch.setattr(buf.engine.lock, "_note", lambda pid: interrupt("note"))
        else:
            set_hook(interrupt)
        with pytest.raises(KeyboardInterrupt):
            buf.add({"x": 666, "y": 666})
        monkeypatch.undo()
        set_hook(None)
        assert (buf.engine.ring.res_pid == 0).all(), "the interrupted write kept its reservation"
        probe = os.open("/proc/self/fd/%d" % other.engine.seg.fd, os.O_RDWR)
        try:
            fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError if still held
            fcntl.flock(probe, fcntl.LOCK_UN)
        finally:
            os.close(probe)
        for i in range(10):  # wraps the 4-slot ring over the abandoned rows twice
            buf.add({"x": i, "y": i}, timeout=1)
            other.add({"x": i, "y": i}, timeout=1)
        assert 666 not in buf.sample(200)["x"]


def test_a_second_ctrl_c_inside_the_cleanup_of_a_write_blocks_nobody(name, monkeypatch, set_hook):
    """Deterministic (the Python path's cleanup): a KeyboardInterrupt mid-copy, then a
    second one inside the cleanup, before the reservation entry is freed (a SIGINT storm
    found this). The entry is left behind with this live process's pid; its next writes
    lap the ring over those rows within a 1 s timeout instead of waiting for themselves."""
    monkeypatch.setenv("SHMBUF_PURE_PYTHON", "1")
    with shmbuf.Buffer.create({"x": ((), "int64")}, 4, name=name, seed=0) as buf:
        assert not buf.native
        buf.add({"x": -1})  # (a buffer file's first write moves its horizon: not the one interrupted)

        def interrupt(where):
            if where == "writing":
                raise KeyboardInterrupt

        def cleanup_interrupted(self, pid, token, runs):
            self._abandon_runs(runs)
            raise KeyboardInterrupt  # before the entry is freed
        set_hook(interrupt)
        monkeypatch.setattr(ring.Ring, "_abandon", cleanup_interrupted)
        with pytest.raises(KeyboardInterrupt):
            buf.add({"x": 666})
        set_hook(None)
        monkeypatch.undo()
        assert (buf.engine.ring.res_pid != 0).sum() == 1  # the leftover
        for i in range(10):  # laps the 4-slot ring over its rows, twice
            buf.add({"x": i}, timeout=1)
        assert 666 not in buf.sample(200)["x"]
        assert (buf.engine.ring.res_pid == 0).all()  # freed by the writer that met it


def test_the_native_paths_python_steps_release_the_lock_without_a_python_call(name, monkeypatch):
    """When the native write needs Python (a dead claimer, a full reservation table, a
    buffer file's horizon), Python takes the lock and gives it back inline: a Ctrl-C can
    fall on any Python call, and one between taking and giving back would leave the
    lock held (a `with`'s __exit__ is such a call). Here every Python-level release
    raises before its first line, as a Ctrl-C there would: the lock is free all the same."""
    with shmbuf.Buffer.create({"x": ((), "int64")}, 8, name=name) as buf:
        ring, lock = buf.engine.ring, buf.engine.ring.lock

        def interrupted():
            raise RuntimeError("a Ctrl-C at the first line of a Python-level release")
        monkeypatch.setattr(lock, "release", interrupted)
        ring._make_way(0, 1.0)
        assert lock.busy[0] == 0 and not lock.thread_lock._is_owned()
        buf.add({"x": 1})  # (the native path, which would wait for busy == 0)
        assert len(buf) == 1


def test_real_sigint_storm_never_leaves_the_buffer_locked_or_reserved(name, tmp_path):
    """Hundreds of real SIGINTs at random instants into a process that adds in a loop
    and catches KeyboardInterrupt. Afterwards (it is alive, idle) others write freely."""
    ready, stop, idle = (tmp_path / n for n in ("ready", "stop", "idle"))
    with shmbuf.Buffer.create({"x": ((), "int64")}, 8, name=name, seed=0) as buf:
        proc = mp.get_context("spawn").Process(target=add_through_interrupts,
                                               args=(name, str(ready), str(stop), str(idle)))
        proc.start()
        try:
            wait_for_file(ready, proc)
            rng = random.Random(0)
            for _ in range(300):
                os.kill(proc.pid, signal.SIGINT)
                time.sleep(rng.uniform(0.0005, 0.003))
            stop.touch()
            wait_for_file(idle, proc, "the writer died")
            assert int(idle.read_text() or 0) > 0, "no interrupt landed inside add"
            assert proc.is_alive()
            for i in range(20):  # wraps the ring: would wait on any reservation it kept
                buf.add({"x": -i}, timeout=2)
            assert set(buf.sample(100)["x"].tolist()) <= {-i for i in range(12, 20)}
        finally:
            _stop(proc)
