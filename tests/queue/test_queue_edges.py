"""Queue mode where it meets the other surfaces (trust round 3): a queue in a file that
restarts while full, a snapshot or restart after a taker died holding older rows, takes
of "whatever is there", Ctrl-C (real SIGINTs) at each point of a take, and the lock a
Ctrl-C must never leave held."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import sys
import time

import pytest

import shmbuf
from helpers import QUEUE_FIELDS, queue_rows, queue_taker, wait_for_file
from shmbuf.core import durable
from shmbuf.queue import takes
from shmbuf.queue import protocol as queue_protocol
from shmbuf.core.layout import CTRL_BOOT

CTX = mp.get_context("fork")


def make(name, capacity=16, lanes=1, **kw):
    if name.endswith(".shmbuf"):
        kw["path"] = name
    else:
        kw["name"] = name
    return shmbuf.Buffer.create(QUEUE_FIELDS, capacity, lanes=lanes, mode="queue", **kw)


def restart(q) -> None:
    """The next open of the queue's file sees another boot (a power loss); ``q`` closed."""
    q.engine.ring.control[CTRL_BOOT] = durable.boot_id() ^ 0x5A5A
    q.close()


def test_a_full_queue_in_a_file_keeps_its_flushed_rows_across_a_restart(tmp_path, monkeypatch):
    """A write that waits for room (back-pressure) must not move the horizon past the
    room: the rollback would drop the oldest flushed rows, never taken."""
    monkeypatch.setattr(durable.Horizon, "FAST", -1.0)
    p = str(tmp_path / "q.shmbuf")
    q = make(p, 16)
    q.extend(queue_rows(0, 0, 16))
    q.flush()
    with pytest.raises(shmbuf.WriteTimeout, match="the queue is full"):
        q.extend(queue_rows(0, 16, 20), timeout=0.2)
    assert q.engine.ring.horizon[0, 0] <= 16  # (base 0 + lane capacity 16)
    restart(q)
    with shmbuf.Buffer.attach(p) as back:
        assert back.take(64, partial=True)["i"].tolist() == list(range(16))
        back.unlink()


def _dead_taker_and_newer_rows_delivered(name, tmp_path) -> "shmbuf.Buffer":
    """Rows 0..9; a taker process claims 0..3 and stops; this process takes 4..7; the
    taker is SIGKILLed. Returns the queue (rows 0..3 given back at the next change)."""
    q = make(name, 16)
    q.extend(queue_rows(0, 0, 10))
    flag = str(tmp_path / "flag")
    p = CTX.Process(target=queue_taker, args=(name, str(tmp_path / "t.log"), str(tmp_path / "stop"), 4,
                                             "claimed", flag))
    p.start()
    wait_for_file(flag, p, "the taker to stop with its rows claimed")
    assert q.take(4)["i"].tolist() == [4, 5, 6, 7]
    os.kill(p.pid, signal.SIGKILL)
    p.join(30)
    return q


@pytest.mark.both_storages
def test_a_snapshot_after_a_taker_died_holds_each_untaken_row_once(name, tmp_path):
    q = _dead_taker_and_newer_rows_delivered(name, tmp_path)
    with q:
        state = q.state_dict()
        q.save(tmp_path / "saved")
        with make(name + "-b" if not name.endswith(".shmbuf") else name[:-7] + "-b.shmbuf", 16) as b:
            b.load_state_dict(state)
            assert len(b) == 6 and b.take(16, partial=True)["i"].tolist() == [0, 1, 2, 3, 8, 9]
            b.unlink()
        with shmbuf.Buffer.load(tmp_path / "saved", name=f"t{os.getpid()}-loaded-{time.monotonic_ns()}") as c:
            assert c.take(16, partial=True)["i"].tolist() == [0, 1, 2, 3, 8, 9]
            c.unlink()
        assert q.take(16, partial=True)["i"].tolist() == [0, 1, 2, 3, 8, 9]  # the original's the same
        q.unlink()


def test_a_restart_after_a_taker_died_delivers_each_untaken_row_once(tmp_path):
    p = str(tmp_path / "q.shmbuf")
    q = _dead_taker_and_newer_rows_delivered(p, tmp_path)
    q.flush()
    restart(q)
    with shmbuf.Buffer.attach(p) as back:
        assert back.take(16, partial=True)["i"].tolist() == [0, 1, 2, 3, 8, 9]
        back.unlink()


@pytest.mark.both_storages
def test_take_whatever_is_there_counts_the_rows_delivered(name):
    with make(name, 16) as q:
        q.extend(queue_rows(0, 0, 5))
        assert q.take(sys.maxsize, partial=True)["i"].tolist() == [0, 1, 2, 3, 4]
        q.extend(queue_rows(0, 5, 8))
        assert q.take(sys.maxsize, partial=True)["i"].tolist() == [5, 6, 7]
        s = q.stats()
        assert (s["rows_sampled"], s["rows_taken"], s["takes"]) == (8, 8, 2)
        q.unlink()


def test_a_take_that_timed_out_counts_its_wait(name):
    with make(name, 16) as q:
        with pytest.raises(shmbuf.SampleTimeout):
            q.take(1, timeout=0.3)
        assert q.stats()["take_wait_s"] >= 0.3


def _sigint_at(point: str, nth: int = 1):
    """A queue hook that sends this process a real SIGINT at the ``nth`` time ``point`` is passed."""
    seen = {"n": 0}

    def hook(where, rows):
        if where == point:
            seen["n"] += 1
            if seen["n"] == nth:
                os.kill(os.getpid(), signal.SIGINT)
    return hook


@pytest.mark.parametrize("point", ["claimed", "copied", "delivering"])
def test_a_sigint_before_the_delivery_commits_gives_the_rows_back(name, monkeypatch, point):
    with make(name, 16) as q:
        q.extend(queue_rows(0, 0, 6))
        monkeypatch.setattr(queue_protocol, "HOOK", _sigint_at(point))
        with pytest.raises(KeyboardInterrupt):
            q.take(4)
        monkeypatch.setattr(queue_protocol, "HOOK", None)
        assert len(q) == 6 and q.stats()["rows_taken"] == 0
        assert q.take(6)["i"].tolist() == [0, 1, 2, 3, 4, 5]


def test_a_sigint_after_the_delivery_committed_keeps_the_rows_for_the_next_take(name, monkeypatch):
    """The journal's commit of the delivery (the claim's is the first commit): the
    interrupt is raised once the delivery settled and the lock is free; the rows are
    this handle's next take's, before newer rows, and counted once."""
    with make(name, 16) as q:
        q.extend(queue_rows(0, 0, 6))
        monkeypatch.setattr(queue_protocol, "HOOK", _sigint_at("commit", 2))
        with pytest.raises(KeyboardInterrupt):
            q.take(4)
        monkeypatch.setattr(queue_protocol, "HOOK", None)
        assert len(q) == 6
        with shmbuf.Buffer.attach(name) as other:  # another handle takes only the rest
            assert other.take(6, partial=True)["i"].tolist() == [4, 5]
        assert q.take(2)["i"].tolist() == [0, 1] and q.take(9, partial=True)["i"].tolist() == [2, 3]
        assert q.stats()["rows_taken"] == 6


def _kept(q, monkeypatch, n):
    """Take ``n`` rows with a real SIGINT right after the delivery's commit: they are
    kept for this handle's next take."""
    monkeypatch.setattr(queue_protocol, "HOOK", _sigint_at("commit", 2))
    with pytest.raises(KeyboardInterrupt):
        q.take(n)
    monkeypatch.setattr(queue_protocol, "HOOK", None)


@pytest.mark.timeout(60)
def test_rows_kept_after_a_sigint_come_first_and_a_take_still_gets_up_to_n(name, monkeypatch):
    """Rows kept for this handle's next take are its first rows, and the take goes on
    past them: with partial=True up to n when more are there ("fewer if fewer are
    there": at once, without waiting for more), a full take completes them with the
    queue's next rows, or, if those do not come in time, raises and keeps them."""
    with make(name, 16) as q:
        q.extend(queue_rows(0, 0, 8))
        _kept(q, monkeypatch, 2)
        assert q.take(5, partial=True)["i"].tolist() == [0, 1, 2, 3, 4]
        _kept(q, monkeypatch, 1)
        assert q.take(2)["i"].tolist() == [5, 6]
        _kept(q, monkeypatch, 1)
        assert q.take(3, partial=True, timeout=120)["i"].tolist() == [7]  # (all there is: at once)
        q.extend(queue_rows(0, 8, 10))
        _kept(q, monkeypatch, 2)
        with pytest.raises(shmbuf.SampleTimeout, match="could not take 1 row"):
            q.take(3, timeout=0.05)
        assert q.take(1)["i"].tolist() == [8] and q.take(1)["i"].tolist() == [9]
        s = q.stats()
        assert (s["rows_taken"], len(q)) == (10, 0)


def test_rows_given_back_older_than_the_kept_ones_come_before_them(name, monkeypatch, tmp_path):
    """A taker holds rows 0-1 (stopped at "claimed"); this handle takes 2-3, kept by a
    SIGINT after the commit; the taker is SIGKILLed (0-1 given back). The next take
    returns 0, 1, 2, 3: each lane's rows in their order within a take."""
    with make(name, 16) as q:
        q.extend(queue_rows(0, 0, 6))
        flag = str(tmp_path / "flag")
        p = CTX.Process(target=queue_taker, args=(name, str(tmp_path / "t.log"), str(tmp_path / "stop"), 2,
                                                 "claimed", flag))
        p.start()
        try:
            wait_for_file(flag, p, "the taker to stop at claimed")
            _kept(q, monkeypatch, 2)
        finally:
            p.kill()
            p.join(30)
        assert q.take(5, partial=True)["i"].tolist() == [0, 1, 2, 3, 4]
        assert q.take(1)["i"].tolist() == [5] and q.stats()["rows_taken"] == 6


@pytest.mark.parametrize("kept", [0, 2])
def test_a_sigint_between_the_delivery_and_the_return_loses_no_row(name, monkeypatch, kept):
    """A take of 4 (after 0 or 2 rows kept by a SIGINT after their delivery) gets a real
    SIGINT once it delivered its rows, before it returns them ("delivered"), or as it
    takes the kept rows out of the list they wait in: KeyboardInterrupt, and the next
    take returns all of them, in order."""
    with make(name, 16) as q:
        q.extend(queue_rows(0, 0, 8))
        if kept:
            _kept(q, monkeypatch, kept)
        monkeypatch.setattr(queue_protocol, "HOOK", _sigint_at("delivered"))
        with pytest.raises(KeyboardInterrupt):
            q.take(4)
        if kept:
            real = takes.merged  # (called as the kept rows are taken out, before they leave their list)

            def interrupted(*args):
                monkeypatch.setattr(takes, "merged", real)
                os.kill(os.getpid(), signal.SIGINT)  # (raised as this call returns)
                return real(*args)
            monkeypatch.setattr(takes, "merged", interrupted)
            with pytest.raises(KeyboardInterrupt):
                q.take(1)
        monkeypatch.setattr(queue_protocol, "HOOK", None)
        assert q.take(8, partial=True)["i"].tolist() == list(range(8))
        assert q.stats()["rows_taken"] == 8 and len(q) == 0


OPS = {  # an operation that holds the header lock, run on an attached handle of a queue
    "queue clear": lambda q: q.clear(),
    "claim_lane": lambda q: q.claim_lane(),
    "release_lane": lambda q: (q.claim_lane(), q.release_lane()),
    "state_dict": lambda q: q.state_dict(),
    "flush": lambda q: q.flush(),
}


def _hold_and_interrupt(name: str, flag: str, op: str) -> None:
    """Run ``op``, which holds the header lock, and get a real SIGINT at the end of its
    (last) hold, as the release begins; then stay alive, having caught it."""
    q = shmbuf.Buffer.attach(name, timeout=30)
    lock = q.engine.lock
    release = lock.release

    def interrupted_release():
        os.kill(os.getpid(), signal.SIGINT)  # lands as the hold ends, before the unlock
        time.sleep(0.05)
        release()
    lock.release = interrupted_release
    try:
        OPS[op](q)
    except KeyboardInterrupt:
        open(flag, "w").close()
    lock.release = release
    while True:
        time.sleep(1)


@pytest.mark.both_storages
@pytest.mark.parametrize("op", sorted(OPS))
def test_a_sigint_as_a_lock_hold_ends_never_leaves_the_lock_held(name, tmp_path, op):
    """Trust round 3, item 7: for every caller of the header lock's hold, a Ctrl-C as
    the hold ends is raised once the lock is free: other processes go on."""
    with make(name, 16, lanes=2) as q:
        q.extend(queue_rows(0, 0, 4), lane=0)
        flag = str(tmp_path / "flag")
        p = CTX.Process(target=_hold_and_interrupt, args=(name, flag, op))
        p.start()
        try:
            wait_for_file(flag, p, "the holder to be interrupted")
            q.engine.lock.acquire(1.0)  # (a LockTimeout here: the lock was left held)
            q.engine.lock.release()
        finally:
            os.kill(p.pid, signal.SIGKILL)
            p.join(30)
        q.extend(queue_rows(0, 4, 5), lane=1)
        assert q.take(9, partial=True)["i"].tolist()[-1] == 4
        q.unlink()


def _hold_the_lock(name: str, flag: str) -> None:
    q = shmbuf.Buffer.attach(name, timeout=30)
    q.engine.lock.acquire(30)
    open(flag, "w").close()
    while True:
        time.sleep(1)


def test_a_take_honours_its_timeout_when_the_lock_is_kept_from_it(name, tmp_path, monkeypatch):
    """Trust round 3, item 7: a take whose delivery cannot get the lock (a holder that
    stopped, here at a chosen point) raises within about its timeout (it waited 10 s
    more to give its rows back); the rows go back once the lock is free."""
    with make(name, 16) as q:
        q.extend(queue_rows(0, 0, 4))
        flag = str(tmp_path / "flag")
        holder = []

        def hook(where, rows):
            if where == "copied":
                p = CTX.Process(target=_hold_the_lock, args=(name, flag))
                p.start()
                holder.append(p)
                wait_for_file(flag, p, "the other process to hold the lock")
        monkeypatch.setattr(queue_protocol, "HOOK", hook)
        t0 = time.monotonic()
        with pytest.raises(shmbuf.LockTimeout):
            q.take(2, timeout=1.0)
        took = time.monotonic() - t0
        monkeypatch.setattr(queue_protocol, "HOOK", None)
        os.kill(holder[0].pid, signal.SIGKILL)
        holder[0].join(30)
        assert took < 8.0, took  # (1 s and the lock's floor; it was 11 s and more)
        assert q.take(4)["i"].tolist() == [0, 1, 2, 3]
