"""Ragged rows under storms (both paths: scripts/test runs this file on each).

**The queue's storm**: a queue with ragged fields, ``versions=True`` and an arena of 6 KB a
lane that wraps every few writes; five writers (two lanes shared by two writers each, one
of them writing stale rows, and a lane claimed by one writer), rows of 0 .. 300 tokens
(every fifth empty), 1 .. 4 rows a write; three takers that take in turn plainly, with
``max_staleness=``, and with that and a token budget. Writers and takers get SIGKILLs and
SIGINTs at random instants and at chosen points: the ring's write points, mid-record
(the arena's "record"), the points of a write whose records start at the arena's start
(a wrap), and a take's points. Killed processes are replaced. Last, with every process
gone, each lane's arena is filled with untaken rows and one more row is written: it must
wait for room (it times out), and the rows are taken whole.

What the logs prove: no row torn (every value and length derived from its (writer,
index)), every fresh row of a write that returned delivered exactly once (but rows a
taker SIGKILLed after copying them may have taken along), no row twice, every stale row
of a write that returned delivered or counted (stale, or skipped), no bounded take's row
below its bound, no budget passed (but by a take's one row), each take's rows of a writer
in order, and nobody hangs.

**The replay storm**: writers SIGKILLed and SIGINTed at random and at chosen points
(mid-record among them) while two samplers sample 16 rows and token budgets throughout;
last, a sampler stopped between its rows' proof and their records' copy while a writer
covers those records: no sample returns a torn row.

Each storm is run again with a protection broken on purpose, and the check sees it.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import random
import signal
import time

import numpy as np
import pytest

import shmbuf
from helpers import (RAGGED_FIELDS, align, fill_lane, ragged_rows, ragged_sampler, ragged_taker, ragged_torn, ragged_writer,
                     read_log, wait_for_file)
from shmbuf.core import arena
from shmbuf.core.layout import LANE_BASE

CTX = mp.get_context("fork")
BOUND, VERSION, BUDGET, BATCH = 98, 100, 500, 5
WRITER_POINTS = [("record", "SIGKILL"), ("wrap:record", "SIGINT"), ("locked", "SIGKILL"), ("reserved", "SIGINT"),
                 ("writing", "SIGKILL"), ("wrap:reserved", "SIGKILL"), ("published", "SIGINT"),
                 ("record", "SIGINT"), ("wrap:record", "SIGKILL")]
TAKER_POINTS = [("claimed", "SIGKILL"), ("copied", "SIGINT"), ("delivering", "SIGKILL"), ("delivered", "SIGINT"),
                ("copied", "SIGKILL"), ("claimed", "SIGINT"), ("delivered", "SIGKILL")]
KEY = 1_000_000_000


def ranges(log, tag: str) -> np.ndarray:
    """The keys' indices of a writer's log lines ``tag`` ("lo,hi" each)."""
    return np.concatenate([np.arange(int(k[0]), int(k[1])) for t, k in log if t == tag] or [np.zeros(0, np.int64)])


class Crew:
    """The storm's processes: writers by slot (a slot: lane, version, claimed), takers or
    samplers; the ones a SIGKILL ended are replaced."""

    def __init__(self, name, tmp_path, slots, reader, reader_args):
        self.name, self.tmp, self.slots = name, tmp_path, slots
        self.reader, self.reader_args = reader, reader_args
        self.stop, self.stop_writing = str(tmp_path / "stop"), str(tmp_path / "stop-writing")
        self.writers, self.slot_of, self.wlogs = {}, {}, {}
        self.readers, self.rlogs, self.killed_readers = {}, [], []
        self.extra: set[int] = set()  # writers that stop at a chosen point beside a shared lane's own

    def writer(self, slot: int, hang: str = "", after: int = 0) -> tuple[int, str]:
        w = len(self.wlogs)
        assert w < 97  # (97 .. 99: the last phases' rows)
        lane, version, claim = self.slots[slot]
        self.wlogs[w], flag = str(self.tmp / f"w{w}.log"), str(self.tmp / f"wflag{w}")
        p = CTX.Process(target=ragged_writer, args=(self.name, w, lane, version, self.wlogs[w], self.stop_writing,
                                                     hang, flag, after, claim))
        p.start()
        self.writers[w], self.slot_of[w] = p, slot
        return w, flag

    def reader_(self, hang: str = "", go: str = "") -> tuple[int, str]:
        r = len(self.rlogs)
        self.rlogs.append(str(self.tmp / f"r{r}.log"))
        flag = str(self.tmp / f"rflag{r}")
        args = (self.name, self.rlogs[r], self.stop, *self.reader_args, hang, flag) + ((go,) if go else ())
        p = CTX.Process(target=self.reader, args=args)
        p.start()
        self.readers[r] = p
        return r, flag

    def signal(self, kind: str, key: int, sig: str) -> None:
        """Send ``sig``; a SIGKILLed process is replaced (a writer by one of its slot)."""
        procs = self.writers if kind == "w" else self.readers
        os.kill(procs[key].pid, getattr(signal, sig))
        if sig == "SIGKILL":
            procs.pop(key).join(30)
            if kind == "w" and key not in self.extra:
                self.writer(self.slot_of[key])
            else:
                self.killed_readers.append(key)
                self.reader_()

    def ready(self, kind: str) -> list[int]:
        """Live processes whose SIGINT handler is in (they made their log)."""
        procs, logs = (self.writers, self.wlogs) if kind == "w" else (self.readers, dict(enumerate(self.rlogs)))
        return [k for k, p in procs.items() if p.is_alive() and os.path.exists(logs[k])]

    def chosen_writer(self, r: int) -> None:
        """A writer stopped at round ``r``'s point, then signalled there."""
        point, sig = WRITER_POINTS[r % len(WRITER_POINTS)]
        slot = r % len(self.slots)
        if self.slots[slot][2]:  # (a claimed lane: its writer makes way for the one that stops)
            old = next(w for w, p in self.writers.items() if self.slot_of[w] == slot)
            os.kill(self.writers[old].pid, signal.SIGKILL)
            self.writers.pop(old).join(30)
        w, flag = self.writer(slot, point, after=1)
        if not self.slots[slot][2]:  # (an extra writer of a shared lane: not replaced)
            self.extra.add(w)
        wait_for_file(flag, self.writers[w], f"a writer to stop at {point!r}", timeout=120)
        self.signal("w", w, sig)

    def random_signals(self, rnd: random.Random, k: int = 2, kinds: str = "wr") -> None:
        for _ in range(k):
            time.sleep(rnd.uniform(0, 0.05))
            kind = rnd.choice(kinds)
            ready = self.ready(kind)
            if ready:
                self.signal(kind, rnd.choice(ready), rnd.choice(["SIGKILL", "SIGINT"]))

    def end_writers(self) -> None:
        open(self.stop_writing, "w").close()
        for p in self.writers.values():
            p.join(150)
            assert p.exitcode == 0, "a writer failed or hung"

    def end_readers(self) -> None:
        open(self.stop, "w").close()
        for p in self.readers.values():
            p.join(150)
            assert p.exitcode == 0, "a reader failed or hung"

    def kill_the_rest(self) -> None:  # (a storm that fails leaves no process running)
        for p in list(self.writers.values()) + list(self.readers.values()):
            if p.is_alive():
                p.kill()
                p.join(30)


# -- the queue -----------------------------------------------------------------------

QUEUE_SLOTS = {0: (0, VERSION, False), 1: (0, 1, False), 2: (1, VERSION, False), 3: (1, 1, False),
               4: (2, VERSION, True)}  # slot: (lane, version, claimed)
STALE_SLOTS = {1, 3}


def drain(q) -> tuple[list[np.ndarray], int, int]:
    """Take what is left: (the keys taken, torn rows, rows a take refused as changed)."""
    got, torn = [], 0
    while True:
        try:
            b = q.take(64, partial=True, timeout=0.5)
        except shmbuf.SampleTimeout:
            return got, torn, 0
        except shmbuf.FormatError as exc:  # (only with a protection broken on purpose)
            return got, torn, int(str(exc).split("the records of ")[1].split()[0])
        got.append(b["w"] * KEY + b["i"])
        torn += ragged_torn(b)


def queue_storm(name: str, tmp_path, rounds: int = len(WRITER_POINTS), last=None) -> dict:
    """Run the queue's storm; what the logs prove (see the module). ``last``: called
    before the last phase (with every process gone)."""
    rnd = random.Random(0)
    lanes = 3
    crew = Crew(name, tmp_path, QUEUE_SLOTS, ragged_taker, (BATCH, BOUND, VERSION, BUDGET))
    with shmbuf.Buffer.create(RAGGED_FIELDS, lanes * 12, lanes=lanes, name=name, mode="queue", versions=True,
                              arena=lanes * 6144) as q, contextlib.ExitStack() as cleanup:
        cleanup.callback(crew.kill_the_rest)
        A = q.engine.ring.records.A
        for slot in QUEUE_SLOTS:
            crew.writer(slot)
        for _ in range(3):
            crew.reader_()
        for r in range(rounds):
            point, sig = TAKER_POINTS[r % len(TAKER_POINTS)]
            t, flag = crew.reader_(point)
            wait_for_file(flag, crew.readers[t], f"a taker to stop at {point!r}", timeout=120)
            crew.signal("r", t, sig)
            crew.chosen_writer(r)
            crew.random_signals(rnd)
        crew.end_writers()
        crew.end_readers()
        here, torn_here, refused = drain(q)
        wraps = int(q.engine.ring.records.heads[:, 0].min()) // A
        # last: each lane's arena full of untaken rows; one more row must wait for room
        if last is not None:
            last()
        extra = {96: list(range(4)), 97: [], 98: [], 99: []}
        stale_before = q.stats()["rows_stale"]
        q.extend(ragged_rows(96, 0, 4), lane=0, version=1, timeout=5)  # (stale rows a bounded take passes over)
        with pytest.raises(shmbuf.SampleTimeout):
            q.take(8, partial=True, timeout=0.2, max_staleness=VERSION - BOUND, version=VERSION)
        passed_over = q.stats()["rows_stale"] - stale_before
        for lane in range(lanes):  # (the fillers taken at once: the arena's room is then the arena)
            extra[97] += [k % KEY for k in align(q, lane, version=VERSION, timeout=5)]
        got, torn_here2, refused2 = drain(q)
        here += got
        for lane in range(lanes):
            for k in fill_lane(q, 98, lane, A // 1024, version=VERSION, timeout=5):
                extra[k // KEY].append(k % KEY)
            i = 10_000 * (lane + 1)
            try:
                q.extend(ragged_rows(99, i, i + 1), lane=lane, version=VERSION, timeout=0.2)
                extra[99].append(i)
            except shmbuf.WriteTimeout:
                pass
        got, torn_last, refused_last = drain(q)
        here += got
        left, stats = len(q), q.stats()
    logs = [read_log(p) for p in crew.rlogs]
    delivered = np.concatenate([k for log in logs for tag, k in log if tag == "D"] + here)
    wlogs = {w: read_log(p) for w, p in crew.wlogs.items()}
    owed = {w: w * KEY + ranges(log, "W") for w, log in wlogs.items()}
    owed.update({w: w * KEY + np.array(i, np.int64) for w, i in extra.items()})
    attempted = np.concatenate([w * KEY + ranges(log, "A") for w, log in wlogs.items()]
                               + [w * KEY + np.array(i, np.int64) for w, i in extra.items()])
    stale = {w for w in crew.wlogs if crew.slot_of[w] in STALE_SLOTS} | {96}
    fresh_owed = np.concatenate([k for w, k in owed.items() if w not in stale])
    stale_owed = np.concatenate([k for w, k in owed.items() if w in stale])
    copied = [k for t in crew.killed_readers for tag, k in logs[t] if tag == "C"]
    taken_there = [k for t in crew.killed_readers for tag, k in logs[t] if tag == "D"]
    unsure = np.setdiff1d(np.concatenate(copied or [np.zeros(0, np.int64)]),
                          np.concatenate(taken_there or [np.zeros(0, np.int64)]))
    missing = np.setdiff1d(fresh_owed, delivered)
    stale_delivered = np.intersect1d(np.unique(delivered), np.concatenate(
        [w * KEY + ranges(wlogs[w], "A") for w in stale if w != 96] + [96 * KEY + np.arange(4)]))
    stale_attempted = sum(len(ranges(wlogs[w], "A")) for w in stale if w != 96) + len(extra[96])
    def count(tag: str) -> int:  # (rows for X, S, F; lines for B, O)
        return sum(int(k[0]) if tag in "XSF" else 1 for log in logs for t, k in log if t == tag)
    return {"twice": len(delivered) - len(np.unique(delivered)),
            "from_nowhere": len(np.setdiff1d(delivered, attempted)),
            "missing_unexplained": len(np.setdiff1d(missing, unsure)), "missing": len(missing),
            "stale_unexplained": max(0, len(np.setdiff1d(np.setdiff1d(stale_owed, delivered), unsure))
                                     - stats["rows_stale"] - stats["rows_skipped"]),
            "stale_overcounted": max(0, stats["rows_stale"] - (stale_attempted - len(stale_delivered))),
            "torn": count("X") + torn_here + torn_here2 + torn_last, "beyond_bound": count("S"), "budget_passed": count("B"),
            "disorder": count("O"), "refused": count("F") + refused + refused2 + refused_last, "passed_over": passed_over,
            "left": left, "last_waited": 99 not in [k // KEY for k in delivered] and not extra[99],
            "delivered": len(delivered), "fresh": len(fresh_owed), "stale_written": len(stale_owed),
            "rows_stale": stats["rows_stale"], "given_back": stats["rows_given_back"], "wraps": wraps,
            "writers": len(crew.wlogs), "interrupted_writes": sum(t == "I" for log in wlogs.values() for t, _ in log),
            "examples": {"missing": np.setdiff1d(missing, unsure)[:5].tolist(),
                         "from_nowhere": np.setdiff1d(delivered, attempted)[:5].tolist(),
                         "budgets": [k.tolist() for log in logs for t, k in log if t == "B"][:5]}}


def test_queue_storm_takes_every_ragged_row_whole_and_once(name, tmp_path):
    got = queue_storm(name, tmp_path)
    assert got["torn"] == 0 and got["twice"] == 0 and got["from_nowhere"] == 0 and got["refused"] == 0, got
    assert got["missing_unexplained"] == 0 and got["stale_unexplained"] == 0 and got["stale_overcounted"] == 0, got
    assert got["beyond_bound"] == 0 and got["disorder"] == 0 and got["budget_passed"] == 0, got
    assert got["left"] == 0 and got["last_waited"], got
    # (the storm did what it claims: arenas wrapped, stale rows passed over, rows given back, writes interrupted)
    assert got["wraps"] >= 3 and got["passed_over"] == 4 and got["given_back"] > 0 and got["interrupted_writes"] > 0, got


def without_room_check(monkeypatch):
    """A queue's writes placed without their wait for room in bytes (the rows' room stays)."""
    reserve = arena.Arena.reserve

    def placed_anyway(self, lane, first, n, sources, bounded):
        base = int(self.ring.lane_table[lane, LANE_BASE])
        reserve(self, lane, first, n, sources, False)  # (placed as a replay buffer's write is)
        self.ring.lane_table[lane, LANE_BASE] = base  # (evicting nothing: a queue's base is its takers')
        return base
    monkeypatch.setattr(arena.Arena, "reserve", placed_anyway)


def test_the_queue_storm_sees_rows_torn_or_lost_without_the_room_check(name, tmp_path, monkeypatch):
    """With the wait for room in bytes off (in the last phase only: in the writers, the
    takers' refusals would give the same rows back forever and the storm would wait out
    the writers' timeouts), the row written past the full arena covers an untaken row's
    record: that take refuses it (or, with the reader's check off too, returns it torn),
    and the rows are lost."""
    got = queue_storm(name, tmp_path, rounds=1, last=lambda: without_room_check(monkeypatch))
    assert not got["last_waited"] and got["refused"] + got["torn"] > 0 and got["missing_unexplained"] > 0, got


def test_the_queue_storm_sees_torn_rows_without_both_checks(name, tmp_path, monkeypatch):
    def last():
        without_room_check(monkeypatch)
        monkeypatch.setattr(arena, "FAULTS", 1)
    got = queue_storm(name, tmp_path, rounds=1, last=last)
    assert got["torn"] > 0, got


# -- the replay buffer ---------------------------------------------------------------

REPLAY_SLOTS = {0: (0, None, False), 1: (0, None, False), 2: (1, None, True)}


def replay_storm(name: str, tmp_path, rounds: int = 6, after=None) -> dict:
    """Run the replay storm; ``after(buf)``: called last, every process gone."""
    rnd = random.Random(1)
    lanes = 2
    crew = Crew(name, tmp_path, REPLAY_SLOTS, ragged_sampler, (700,))
    go = str(tmp_path / "go")
    with shmbuf.Buffer.create(RAGGED_FIELDS, lanes * 32, lanes=lanes, name=name, arena=lanes * 4096) as buf, \
            contextlib.ExitStack() as cleanup:
        cleanup.callback(crew.kill_the_rest)
        A = buf.engine.ring.records.A
        for slot in REPLAY_SLOTS:
            crew.writer(slot)
        for _ in range(2):
            crew.reader_()
        for r in range(rounds):
            crew.chosen_writer(r)
            crew.random_signals(rnd, 3, kinds="w")  # (the samplers sample throughout)
        crew.end_writers()
        wraps = int(buf.engine.ring.records.heads[:, 0].min()) // A
        # last: a sampler stopped between its rows' proof and their records' copy while
        # each lane's arena is written over, record for record
        for lane in range(lanes):
            fill_lane(buf, 98, lane, A // 1024)
        r, flag = crew.reader_("reading", go)
        wait_for_file(flag, crew.readers[r], "a sampler to stop before its records' copy", timeout=120)
        for lane in range(lanes):
            fill_lane(buf, 99, lane, A // 1024)
        open(go, "w").close()
        while not any(t == "N" for t, _ in read_log(crew.rlogs[r])):  # (its first 20 samples, at least)
            assert crew.readers[r].is_alive()
            time.sleep(0.01)
        crew.end_readers()
        if after is not None:
            after(buf)
    n = np.array([k for log in map(read_log, crew.rlogs) for t, k in log if t == "N"]).sum(0)
    return {"checked": int(n[0]), "torn": int(n[1]), "budget_passed": int(n[2]), "timeouts": int(n[3]),
            "wraps": wraps, "writers": len(crew.wlogs),
            "interrupted_writes": sum(t == "I" for p in crew.wlogs.values() for t, _ in read_log(p))}


def test_replay_storm_samples_only_whole_ragged_rows(name, tmp_path):
    got = replay_storm(name, tmp_path)
    assert got["torn"] == 0 and got["budget_passed"] == 0 and got["timeouts"] == 0, got
    assert got["checked"] > 0 and got["wraps"] >= 3 and got["interrupted_writes"] > 0, got


def test_the_replay_storm_sees_torn_rows_without_the_record_check(name, tmp_path, monkeypatch):
    """With the reader's record check off (forked samplers inherit it), the sampler
    stopped before its copy returns the records written over it: torn."""
    monkeypatch.setattr(arena, "FAULTS", 1)
    got = replay_storm(name, tmp_path, rounds=1)
    assert got["torn"] > 0, got


# -- a late writer's bytes -----------------------------------------------------------

def late_writer(name: str, flag: str, go: str) -> None:
    """Write one row (w=98, i=0: 1,024 record bytes) into lane 0, stopping at "reserved"
    (its record placed, no byte written) until ``go`` exists."""
    def hook(where: str) -> None:
        if where == "reserved":
            open(flag, "w").close()
            deadline = time.monotonic() + 60
            while not os.path.exists(go) and time.monotonic() < deadline:
                time.sleep(0.01)
    from shmbuf.core import ring
    buf = shmbuf.Buffer.attach(name, timeout=30)
    ring.set_hook(hook)
    buf.extend(ragged_rows(98, 0, 1), lane=0, timeout=30)


@contextlib.contextmanager
def stopped_late_writer(name: str, tmp_path):
    """:func:`late_writer` in a process, stopped at "reserved" while the block runs; then
    it goes on and must end well (killed if the block failed)."""
    flag, go = str(tmp_path / "at-reserved"), str(tmp_path / "go")
    p = CTX.Process(target=late_writer, args=(name, flag, go))
    p.start()
    try:
        wait_for_file(flag, p, "the late writer to stop at 'reserved'")
        yield p
        open(go, "w").close()
        p.join(30)
        assert p.exitcode == 0
    finally:
        if p.is_alive():
            p.kill()
            p.join(30)


def written(extend) -> bool:
    """Whether ``extend()`` wrote (else it timed out waiting for the stopped writer)."""
    try:
        extend()
        return True
    except shmbuf.WriteTimeout as exc:
        assert "still writing rows whose records" in str(exc)
        return False


@pytest.mark.parametrize("broken", [False, True], ids=["protected", "wait-off"])
def test_a_late_writers_bytes_never_land_in_a_newer_record(name, tmp_path, monkeypatch, broken):
    """A writer stopped with its record placed and no byte written; another write wraps
    the arena over it (evicting its row). That write waits for the stopped writer (it
    times out: nothing of it is published); with the wait off (``Arena.wait`` a no-op) it
    is published, the stopped writer's late bytes land in its record, and a sample sees
    its row torn."""
    if broken:
        monkeypatch.setattr(arena.Arena, "wait", lambda self, *a: None)
    i = 10  # 4 rows of 1,024 bytes after its 1,024: the 4th starts where its record is
    with shmbuf.Buffer.create(RAGGED_FIELDS, 16, name=name, arena=4096, seed=0) as buf:
        with stopped_late_writer(name, tmp_path):
            buf.extend(ragged_rows(99, i, i + 3), lane=0, timeout=5)
            wrote = written(lambda: buf.extend(ragged_rows(99, i + 3, i + 4), lane=0, timeout=0.3))
        b = buf.sample(64, timeout=5)
        assert wrote == broken
        assert (b["w"] == 99).all() and set(b["i"].tolist()) == set(range(i, i + 3 + wrote))
        torn = {int(b["i"][j]) for j in range(len(b["w"])) if ragged_torn({k: v[[j]] for k, v in b.items()})}
        assert torn == ({i + 3} if broken else set())  # (the row whose record the late bytes landed in)


def test_a_budgets_rows_all_covered_before_their_copy_are_drawn_again(name, monkeypatch):
    """A token budget's draw whose every row has its record covered between the rows'
    proof and the records' copy draws again (it was a FormatError: 'the segment was
    written by something that does not follow the protocol')."""
    with shmbuf.Buffer.create(RAGGED_FIELDS, 16, name=name, arena=4096, seed=0) as buf:
        fill_lane(buf, 98, 0, 4)

        def cover(where: str) -> None:
            if where == "reading":  # (the first read: its one row's record written over)
                monkeypatch.setattr(arena, "HOOK", None)
                fill_lane(buf, 99, 0, 4)
        monkeypatch.setattr(arena, "HOOK", cover)
        b = buf.sample(max_tokens=1, length="R", timeout=5)
        assert arena.HOOK is None and b["w"].tolist() == [99] and ragged_torn(b) == 0


def test_a_late_writers_bytes_never_land_in_a_record_placed_after_its_row_left(name, tmp_path):
    """A writer stopped with its record (1,024 bytes) placed and no byte written; a write
    wraps the arena over the record's first half (evicting its row: it waits for the
    stopped writer, and times out), then another over its second half. That second write
    evicts nothing (the row left already), but the stopped writer's late bytes would land
    in its record all the same: it must wait for it too (it published at once: once the
    stopped writer went on, a sample saw its row torn)."""
    half = lambda k: ragged_rows(97, k * 10_000 + 128, k * 10_000 + 129)  # noqa: E731 (512 record bytes)
    with shmbuf.Buffer.create(RAGGED_FIELDS, 16, name=name, arena=4096, seed=0) as buf:
        with stopped_late_writer(name, tmp_path):
            buf.extend(ragged_rows(99, 10, 13), lane=0, timeout=5)  # (the arena's rest: 3 x 1,024 bytes)
            assert not written(lambda: buf.extend(half(1), lane=0, timeout=0.3))  # (the record's first half)
            wrote = written(lambda: buf.extend(half(2), lane=0, timeout=0.3))  # (its second half)
        b = buf.sample(64, timeout=5)
        torn = {(int(b["w"][j]), int(b["i"][j])) for j in range(len(b["w"]))
                if ragged_torn({k: v[[j]] for k, v in b.items()})}
        assert torn == set() and not wrote and set(b["i"].tolist()) == {10, 11, 12}, (torn, wrote)


def tokens_row(k: int, length: int) -> dict:
    return {"tokens": [np.full(length, k, np.int32)], "logprobs": [np.zeros(length, np.float32)],
            "prompt": [np.zeros(0, np.int32)], "w": [0], "i": [k]}


def slow_writer(name: str, flag: str, go: str) -> None:
    """Write row 0 (200 tokens), stopping at "writing" (reserved, not published) until ``go``."""
    from shmbuf.core import ring

    def hook(where: str) -> None:
        if where == "writing":
            ring.set_hook(None)
            open(flag, "w").close()
            deadline = time.monotonic() + 60
            while not os.path.exists(go) and time.monotonic() < deadline:
                time.sleep(0.001)
    q = shmbuf.Buffer.attach(name, timeout=30)
    ring.set_hook(hook)
    q.extend(tokens_row(0, 200), timeout=30)


def test_a_budget_holds_when_rows_are_published_between_its_fit_and_its_claim(name, tmp_path, monkeypatch):
    """Row 0 (200 tokens) is being written as a take with a budget of 250 tokens looks at
    the queue: its fit sees no row (the lane's first row is held), then row 0 is published
    before the claim, which takes rows 0 .. 3 (500 tokens) instead of row 0 alone."""
    from shmbuf.queue import takes
    flag, go = str(tmp_path / "at-writing"), str(tmp_path / "go")
    with shmbuf.Buffer.create(RAGGED_FIELDS, 8, name=name, mode="queue", arena=1 << 14) as q:
        p = CTX.Process(target=slow_writer, args=(name, flag, go))
        p.start()
        try:
            wait_for_file(flag, p, "the writer to stop at 'writing'")
            for k in (1, 2, 3):
                q.extend(tokens_row(k, 100), timeout=5)
            candidates, stamps = takes.candidates, q.engine.ring.stamps

            def then_published(*args):  # (the fit's rows seen; row 0 published before the claim)
                got = candidates(*args)
                monkeypatch.setattr(takes, "candidates", candidates)
                open(go, "w").close()
                deadline = time.monotonic() + 30
                while stamps[0] != 2 and time.monotonic() < deadline:
                    time.sleep(0.001)
                return got
            monkeypatch.setattr(takes, "candidates", then_published)
            b = q.take(5, partial=True, max_tokens=250, length="R", timeout=5)
            p.join(30)
        finally:
            if p.is_alive():
                p.kill()
                p.join(30)
        assert b["i"].tolist() == [0], b["i"].tolist()


# -- in a buffer file ----------------------------------------------------------------

@pytest.mark.parametrize("storage", ["file"], indirect=True)
def test_queue_storm_in_a_file_takes_every_ragged_row_whole_and_once(name, tmp_path):
    """The queue's storm, shorter, on a buffer file (``name`` is its path)."""
    got = queue_storm(name, tmp_path, rounds=4)
    assert got["torn"] == 0 and got["twice"] == 0 and got["from_nowhere"] == 0 and got["refused"] == 0, got
    assert got["missing_unexplained"] == 0 and got["stale_unexplained"] == 0 and got["stale_overcounted"] == 0, got
    assert got["beyond_bound"] == 0 and got["disorder"] == 0 and got["budget_passed"] == 0, got
    assert got["left"] == 0 and got["last_waited"], got  # (its last phase fills each arena: a wrap, whatever the load)


@pytest.mark.parametrize("storage", ["file"], indirect=True)
def test_replay_storm_in_a_file_then_a_restart_leaves_only_whole_ragged_rows(name, tmp_path):
    """The replay storm, shorter, on a buffer file; then a flush and a restart of the
    machine: every row the file holds is whole, and the newest rows of the last phase
    are among them."""
    from shmbuf.core import durable
    from shmbuf.core.layout import CTRL_BOOT
    from shmbuf.ragged.jagged import Jagged

    def restart(buf) -> None:
        buf.flush()
        buf.engine.ring.control[CTRL_BOOT] = durable.boot_id() ^ 0x5A5A
    got = replay_storm(name, tmp_path, rounds=3, after=restart)
    assert got["torn"] == 0 and got["budget_passed"] == 0 and got["timeouts"] == 0, got
    assert got["checked"] > 0, got  # (its last phase writes each arena over twice, whatever the load)
    with shmbuf.Buffer.attach(name) as back:
        state = back.state_dict()
        kept = np.flatnonzero(state["stamps"])
        batch = {k: state["data"][k][kept] for k in ("w", "i")}
        batch.update({k: Jagged(v, o) for k, (v, o) in state["ragged"].items()})
        stamps = back.engine.ring.stamps
        assert ragged_torn(batch) == 0 and len(kept) == np.count_nonzero((stamps > 0) & (stamps % 2 == 0))
        assert (batch["w"] == 99).sum() >= 2, batch["w"]  # (the last phase's rows: 4 kB a lane of them)

