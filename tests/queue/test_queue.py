"""Queue mode (shmbuf.queue.protocol): order, exactly-once delivery, back-pressure, takers
and writers that die at chosen points, persistence, bad input."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal

import pytest

import shmbuf
from helpers import QUEUE_FIELDS, keys, queue_rows, queue_taker, queue_torn, queue_writer, wait_for_file
from shmbuf.queue import protocol as queue_protocol

CTX = mp.get_context("fork")


def make(name, capacity=16, lanes=1, **kw):
    return shmbuf.Buffer.create(QUEUE_FIELDS, capacity, name=name, lanes=lanes, mode="queue", **kw)


def kill_writer_in_a_write(name, tmp_path) -> None:
    """A writer that stops inside its first write (rows reserved, not published), SIGKILLed."""
    flag = str(tmp_path / "flag")
    p = CTX.Process(target=queue_writer, args=(name, 1, 100, 3, str(tmp_path / "w.log"), "writing", flag, 0))
    p.start()
    wait_for_file(flag, p, "the writer to stop inside its write")
    os.kill(p.pid, signal.SIGKILL)
    p.join(30)


def kill_taker_at(name, tmp_path, point: str, check=None) -> None:
    """Start a taker of 4 rows that stops at ``point`` of its take; ``check()`` there;
    SIGKILL it."""
    flag = str(tmp_path / "flag")
    p = CTX.Process(target=queue_taker, args=(name, str(tmp_path / "t.log"), str(tmp_path / "stop"), 4,
                                             point, flag))
    p.start()
    wait_for_file(flag, p, f"the taker to stop at {point}")
    if check is not None:
        check()
    os.kill(p.pid, signal.SIGKILL)
    p.join(30)


def test_rows_are_taken_in_order_each_once(name):
    with make(name, 16) as q:
        q.extend(queue_rows(0, 0, 5))
        q.add({k: v[0] for k, v in queue_rows(0, 5, 6).items()})
        assert len(q) == 6 and q.fields.keys() == QUEUE_FIELDS.keys()
        a = q.take(4)
        b = q.take(4, partial=True)
        assert a["i"].tolist() == [0, 1, 2, 3] and b["i"].tolist() == [4, 5]
        assert queue_torn(a) == queue_torn(b) == 0 and len(q) == 0
        s = q.stats()
        assert (s["rows_taken"], s["takes"], s["queue_depth"]) == (6, 2, 0)


def test_across_lanes_rows_come_in_the_order_their_writes_began(name):
    with make(name, 16, lanes=2) as q:
        for i in range(6):  # alternate lanes: the order of the writes is the order taken
            q.extend(queue_rows(i % 2, i, i + 1), lane=i % 2)
        assert q.take(6)["i"].tolist() == [0, 1, 2, 3, 4, 5]


def test_a_full_queue_makes_writers_wait_and_never_overwrites(name):
    with make(name, 8) as q:
        q.extend(queue_rows(0, 0, 8))
        with pytest.raises(shmbuf.WriteTimeout, match="the queue is full.*8 rows not yet delivered"):
            q.extend(queue_rows(0, 8, 9), timeout=0.1)
        assert q.take(1)["i"].tolist() == [0]  # room for one row
        q.extend(queue_rows(0, 8, 9), timeout=0.1)
        assert q.take(8)["i"].tolist() == list(range(1, 9))


@pytest.mark.both_storages
def test_a_blocked_writer_goes_on_once_a_taker_frees_room(name, tmp_path):
    """A writer process fills the queue and then waits inside its write; each take lets
    it on; nothing it wrote is lost or overwritten."""
    with make(name, 8) as q:
        log = str(tmp_path / "w.log")
        p = CTX.Process(target=queue_writer, args=(name, 0, 40, 4, log))
        p.start()
        got = []
        while len(got) < 40:
            got += q.take(3, partial=True, timeout=60)["i"].tolist()
        p.join(60)
        assert p.exitcode == 0 and got == list(range(40))
        assert q.stats()["rows_taken"] == 40


def test_a_first_write_that_fails_keeps_no_lane(name):
    with shmbuf.Buffer.create({"x": ((), "int64")}, 4, lanes=2, name=name, mode="queue") as q:
        q.extend({"x": [0, 1]}, lane=0)
        q.extend({"x": [2, 3]}, lane=1)  # full, and no lane claimed
        with shmbuf.Buffer.attach(name) as w:
            with pytest.raises(shmbuf.WriteTimeout, match="the queue is full"):
                w.add({"x": 4}, timeout=0.01)  # claims a lane, then times out
            assert w.engine.lane is None
            assert [d["claimed_by"] for d in q.stats()["lanes"]] == [None, None]
            q.take(4)
            w.add({"x": 4})  # claims one again
            assert w.engine.lane is not None


def test_take_waits_then_times_out_and_changes_nothing(name):
    with make(name, 8) as q:
        with pytest.raises(shmbuf.SampleTimeout, match="could not take any row"):
            q.take(2, partial=True, timeout=0.05)
        q.extend(queue_rows(0, 0, 2))
        with pytest.raises(shmbuf.SampleTimeout, match="holds 2 row.*partial=True"):
            q.take(3, timeout=0.05)
        assert len(q) == 2 and q.take(2)["i"].tolist() == [0, 1]


@pytest.mark.both_storages
@pytest.mark.parametrize("point", ["claimed", "copied"])
def test_a_taker_killed_inside_a_take_gives_its_rows_back(name, tmp_path, point):
    """SIGKILLed after claiming rows (or after copying them) and before returning: the
    next take delivers those rows first, before newer ones."""
    with make(name, 16) as q:
        q.extend(queue_rows(0, 0, 6))

        def claimed():
            assert len(q) == 2  # 4 claimed by the taker
        kill_taker_at(name, tmp_path, point, claimed)
        q.extend(queue_rows(0, 6, 8))
        assert q.take(8)["i"].tolist() == [0, 1, 2, 3, 4, 5, 6, 7]
        assert q.stats()["rows_given_back"] == 4


def test_without_the_give_back_a_killed_takers_rows_are_lost(name, tmp_path, monkeypatch):
    """The protection matters: with the give-back switched off, the same kill loses rows."""
    monkeypatch.setattr(queue_protocol, "GIVE_BACK", False)
    with make(name, 16) as q:
        q.extend(queue_rows(0, 0, 6))
        kill_taker_at(name, tmp_path, "claimed")
        assert q.take(6, partial=True)["i"].tolist() == [4, 5]


def test_an_interrupted_take_gives_its_rows_back_at_once(name, monkeypatch):
    """Ctrl-C inside a take (after the claim): the rows go back, delivered next."""
    def hook(point, rows):
        if point == "copied":
            raise KeyboardInterrupt
    with make(name, 16) as q:
        q.extend(queue_rows(0, 0, 5))
        monkeypatch.setattr(queue_protocol, "HOOK", hook)
        with pytest.raises(KeyboardInterrupt):
            q.take(3)
        monkeypatch.setattr(queue_protocol, "HOOK", None)
        assert len(q) == 5 and q.take(5)["i"].tolist() == [0, 1, 2, 3, 4]


@pytest.mark.both_storages
def test_a_writer_killed_mid_write_leaves_nothing_a_taker_sees(name, tmp_path):
    """Its rows are never delivered (they are skipped once no live writer holds them);
    rows written after them into the same lane are."""
    with make(name, 16) as q:
        kill_writer_in_a_write(name, tmp_path)
        q.extend(queue_rows(0, 0, 3))
        b = q.take(3, timeout=5)
        assert b["w"].tolist() == [0, 0, 0] and queue_torn(b) == 0
        assert q.stats()["rows_skipped"] >= 1 and len(q) == 0


def test_state_dict_and_save_keep_the_rows_not_yet_taken_in_order(name, tmp_path):
    with make(name, 16, lanes=2) as q:
        for i in range(8):
            q.extend(queue_rows(i % 2, i, i + 1), lane=i % 2)
        q.take(3)
        state = q.state_dict()
        q.save(tmp_path / "q")
        with make(name + "-b", 16, lanes=2) as b:
            b.load_state_dict(state)
            assert len(b) == 5 and b.take(5)["i"].tolist() == [3, 4, 5, 6, 7]
        with shmbuf.Buffer.load(tmp_path / "q", name=name + "-c") as c:
            assert c.engine.writes is not None and c.take(5)["i"].tolist() == [3, 4, 5, 6, 7]
        q.clear()
        assert len(q) == 0
        q.extend(queue_rows(0, 9, 10), lane=0)
        assert q.take(1)["i"].tolist() == [9]


def test_a_queue_is_taken_from_and_a_replay_buffer_sampled(name):
    with make(name, 8) as q:
        q.extend(queue_rows(0, 0, 2))
        with pytest.raises(ValueError, match="consumed in order with take"):
            q.sample(1)
        with pytest.raises(ValueError, match="consumed in order with take"):
            q.sample_sequences(1, 1)
        with pytest.raises(ValueError, match="never drops rows"):
            q.extend(queue_rows(0, 0, 2), truncate_ok=True)
        with pytest.raises(ValueError, match="capacity 8"):
            q.take(9)
        with pytest.raises(ValueError, match="n must be >= 1"):
            q.take(0)
        assert len(q) == 2
    with shmbuf.Buffer.create(QUEUE_FIELDS, 8, name=name) as buf:
        with pytest.raises(ValueError, match="mode='queue'"):
            buf.take(1)
    with pytest.raises(ValueError, match="mode must be"):
        shmbuf.Buffer.create(QUEUE_FIELDS, 8, mode="fifo")
    with pytest.raises(ValueError, match="mode=.queue. and priority=0.6 do not go together: a queue is consumed in order"):
        shmbuf.Buffer.create(QUEUE_FIELDS, 8, mode="queue", priority=0.6)


def test_garbage_in_the_take_table_is_ignored(name):
    """The table is untrusted: entries that cannot be right are freed, never followed."""
    with make(name, 8) as q:
        q.extend(queue_rows(0, 0, 4))
        t = q.engine.writes.table
        t[0] = [1, os.getpid(), 0, 7, -5, 10**9, 0, 0]  # lane out of range, rows outside the lane
        t[1] = [9, 0, 0, 0, 0, 0, 0, 0]  # unknown state
        t[2] = [2, 0, 0, 0, 3, 10**6, 0, 0]  # given back, past the head
        assert q.take(4)["i"].tolist() == [0, 1, 2, 3]
        assert not (t[:, 0] != 0).any()


@pytest.mark.both_storages
def test_attach_by_name_writes_and_takes(name):
    with make(name, 8):
        w = shmbuf.Buffer.attach(name)
        w.extend(queue_rows(3, 0, 2))
        assert keys(shmbuf.Buffer.attach(name).take(2)).tolist() == [3_000_000_000, 3_000_000_001]
        w.close()


@pytest.mark.both_storages
def test_rows_of_a_dead_writer_do_not_keep_room_from_the_living(name, tmp_path):
    """A lane whose front holds only a dead writer's rows: a take that finds nothing
    else still skips them, so writers get their room back."""
    with make(name, 4) as q:
        kill_writer_in_a_write(name, tmp_path)
        with pytest.raises(shmbuf.SampleTimeout):
            q.take(1, timeout=0.05)
        assert len(q) == 0
        q.extend(queue_rows(0, 0, 4), timeout=5)
        assert q.take(4)["i"].tolist() == [0, 1, 2, 3]


@pytest.mark.both_storages
@pytest.mark.parametrize("point", ["commit@1", "commit@2"])
def test_a_taker_killed_inside_a_commit_leaves_the_change_whole(name, tmp_path, point):
    """SIGKILLed after committing a change to the journal and before writing it (its
    claim: commit 1; its delivery: commit 2): the next holder of the lock finishes the
    change. A claim's rows are then given back and delivered; a delivery stands."""
    with make(name, 16) as q:
        q.extend(queue_rows(0, 0, 6))

        def committed():
            assert q.engine.writes.journal[0] > 0  # committed, not yet applied
        kill_taker_at(name, tmp_path, point, committed)
        rest = q.take(6, partial=True)["i"].tolist()
        assert rest == ([0, 1, 2, 3, 4, 5] if point == "commit@1" else [4, 5])
        assert q.engine.writes.journal[0] == 0 and len(q) == 0
