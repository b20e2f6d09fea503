"""The records' protocol at chosen points (shmbuf/core/arena.py): a record covered while
a reader copies it is never returned (and is, with the check switched off); a writer
killed mid-record, or at any point of its write, costs its own row only and blocks
nobody; a writer waits for a live writer still writing a row its records evict."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading

import numpy as np
import pytest

import shmbuf
from shmbuf.core import arena

CTX = mp.get_context("fork")
FIELDS = {"t": ((None,), np.int64), "k": ((), np.int64)}


def whole(batch: dict) -> bool:
    """Every row's values are its k."""
    return all((batch["t"][i] == k).all() for i, k in enumerate(batch["k"].tolist()))


@pytest.mark.parametrize("broken", [False, True])
def test_a_record_covered_mid_copy_is_drawn_again(name, monkeypatch, broken):
    """A reader stopped after the checked gather of a row's fixed part, before it copies
    the row's record; a writer then covers the whole arena. The reader's row is drawn
    again (a whole row comes out); with the check off it returns the covered bytes."""
    if broken:
        monkeypatch.setattr(arena, "FAULTS", 1)
    with shmbuf.Buffer.create(FIELDS, 64, name=name, arena=1024, seed=0) as buf:
        buf.add({"t": np.full(16, 1), "k": 1})  # 128 bytes at 0
        stopped, go = threading.Event(), threading.Event()

        def hook(point):
            if point == "reading" and not stopped.is_set() and threading.current_thread() is not writer_thread:
                stopped.set()
                assert go.wait(30)
        monkeypatch.setattr(arena, "HOOK", hook)
        got = {}
        writer_thread = None

        def read():
            got["batch"] = buf.sample(1, timeout=30)
        t = threading.Thread(target=read)
        t.start()
        assert stopped.wait(30)
        writer_thread = threading.current_thread()
        for k in range(2, 12):  # 10 x 128 bytes: the arena (1,024) wraps over row 1's record
            buf.add({"t": np.full(16, k), "k": k})
        go.set()
        t.join(30)
        b = got["batch"]
        if broken:
            assert b["k"].tolist() == [1] and not whole(b)  # the covered bytes came out: torn
        else:
            assert b["k"].tolist() != [1] and whole(b)


def _writer(name, point, ready):
    """Write one row of k=7 and stop at ``point`` of its write (the parent kills us)."""
    buf = shmbuf.Buffer.attach(name)
    from shmbuf.core import ring

    def stop(p):
        if p == point:
            open(ready, "w").close()
            signal.pause()
    if point == "record":
        arena.HOOK = stop
    else:
        ring.set_hook(stop)
    buf.extend({"t": [np.full(40, 7), np.full(40, 7)], "k": [7, 7]})


@pytest.mark.parametrize("point", ["locked", "reserved", "record", "writing"])
def test_a_writer_killed_mid_record_costs_its_rows_only(name, tmp_path, point):
    with shmbuf.Buffer.create(FIELDS, 16, name=name, arena=2048, seed=0) as buf:
        buf.extend({"t": [np.full(8, k) for k in range(4)], "k": np.arange(4)})
        ready = str(tmp_path / "ready")
        p = CTX.Process(target=_writer, args=(name, point, ready))
        p.start()
        while not os.path.exists(ready):
            assert p.is_alive()
            p.join(0.01)
        os.kill(p.pid, signal.SIGKILL)
        p.join(30)
        b = buf.sample(200, timeout=5)
        assert 7 not in b["k"].tolist() and whole(b)
        # others write on past the dead writer's rows, wrapping the arena many times
        for k in range(8, 200):
            buf.add({"t": np.full(k % 50, k), "k": k}, timeout=5)
        b = buf.sample(200, timeout=5)
        assert whole(b) and 7 not in b["k"].tolist() and min(b["k"].tolist()) > 100


def test_a_writer_waits_for_a_live_writer_of_a_row_it_evicts(name, tmp_path, set_hook):
    """A writer stopped at "reserved" (its record placed, nothing written): a second
    writer whose records evict that row waits for it (a timeout says who), and goes on
    once it is done."""
    with shmbuf.Buffer.create(FIELDS, 16, name=name, arena=1024, lanes=1) as buf:
        ready, go = str(tmp_path / "ready"), str(tmp_path / "go")

        def slow(path):
            b = shmbuf.Buffer.attach(name)
            from shmbuf.core import ring

            def stop(p):
                if p == "reserved":
                    open(ready, "w").close()
                    for _ in range(6000):  # (30 s at most: a failed test leaves no process behind)
                        if os.path.exists(go):
                            break
                        threading.Event().wait(0.005)
            ring.set_hook(stop)
            b.add({"t": np.full(60, 5), "k": 5})  # 480 bytes
            b.close()
        p = CTX.Process(target=slow, args=(None,))
        p.start()
        while not os.path.exists(ready):
            assert p.is_alive()
            p.join(0.01)
        try:
            with pytest.raises(TimeoutError, match=rf"live process\(es\) \[{p.pid}\] are still writing rows whose records"):
                buf.add({"t": np.full(120, 6), "k": 6}, timeout=0.2)  # 960 bytes: evicts row 5
        finally:
            open(go, "w").close()
        buf.add({"t": np.full(120, 6), "k": 6}, timeout=30)
        p.join(30)
        assert p.exitcode == 0
        b = buf.sample(50)
        assert whole(b) and set(b["k"].tolist()) == {6}


def test_a_sigint_between_a_shared_writers_eviction_and_its_commit_waits_for_the_commit(name, monkeypatch):
    """A writer of a lane it does not own evicts (the lane's base and arena head move)
    and commits its reservation under the header lock: a Ctrl-C that lands between the
    two is raised once the lock is free, so the change is whole (the head moved past its
    rows, which are abandoned, never published) and the buffer goes on. Before: the
    interrupt left the base moved and the head not, the evicted rows gone with no
    reservation in their place."""
    from shmbuf.core.layout import LANE_BASE, LANE_CLAIM_PID, LANE_HEAD

    fields = {"r": ((None,), np.int64), "k": ((), np.int64)}
    with shmbuf.Buffer.create(fields, 64, name=name, lanes=2, arena=2048, seed=0) as buf:
        ring = buf.engine.ring
        lane = next(i for i in range(2) if int(ring.lane_table[i, LANE_CLAIM_PID]) != os.getpid())
        for k in range(10):
            buf.add({"r": np.full(10, k), "k": k}, lane=lane)  # 80 bytes a row, 1,024 an arena
        first = int(ring.lane_table[lane, LANE_HEAD])
        real = ring.records.reserve

        def reserve(*args, **kw):  # (the interrupt lands right after the eviction)
            got = real(*args, **kw)
            os.kill(os.getpid(), signal.SIGINT)
            return got

        monkeypatch.setattr(ring.records, "reserve", reserve)
        with pytest.raises(KeyboardInterrupt):
            buf.add({"r": np.full(100, 99), "k": 99}, lane=lane)  # 800 bytes: evicts most rows
        monkeypatch.undo()
        assert int(ring.lane_table[lane, LANE_HEAD]) == first + 1  # the reservation committed with its eviction
        assert int(ring.lane_table[lane, LANE_BASE]) > first - 10  # (rows were evicted)
        buf.add({"r": np.full(3, 7), "k": 7}, lane=lane)
        b = buf.sample(64)
        assert all((b["r"][i] == k).all() and len(b["r"][i]) == (3 if k == 7 else 10)
                   for i, k in enumerate(b["k"].tolist())) and 99 not in b["k"].tolist()


def test_a_lanes_base_moves_for_rows_whose_records_are_covered_only(name):
    """A replay buffer's lane base is its first row since a clear (the TorchRL facade
    counts a lane's slots from it): the ring going round leaves it where it is; rows
    the ring still holds whose records new values cover move it past them (they left).
    Before, every wrap of the ring moved the base as well (to the first row the ring
    kept), which renumbered the facade's slots."""
    with shmbuf.Buffer.create(FIELDS, 8, name=name, arena=1 << 16) as buf:
        for n in (4, 3, 1, 5):  # (13 rows into 8 slots, 104 bytes each: the arena covers none)
            buf.extend({"t": [np.full(13, k) for k in range(n)], "k": np.arange(n)})
        assert buf.engine.bases().tolist() == [0] and len(buf) == 8
    with shmbuf.Buffer.create(FIELDS, 8, name=name + "-small", arena=256) as buf:
        for k in range(3):  # (120 bytes each: two fit the 256-byte arena)
            buf.add({"t": np.full(15, k), "k": k})
        assert buf.engine.bases().tolist() == [1] and len(buf) == 2 and whole(buf.sample(4))
