"""Ragged rows in a buffer file (``path=``): what a power loss keeps, what a killed
process costs (see shmbuf.core.arena, "In a buffer file", and shmbuf.core.durable).

A power loss is simulated on the file's bytes: the disk holds the file as the last flush
left it, plus every page written to it since by an explicit ``msync`` (the horizons'),
plus any combination of the other pages changed since (the kernel writes pages back in
no order); the header's boot id is another boot's, so the next open recovers."""

from __future__ import annotations

import time

import numpy as np
import pytest

import shmbuf
from helpers import RAGGED_FIELDS, kill_when_there, power_cut_images, ragged_keys, ragged_rows, ragged_torn
from shmbuf.core import arena, durable, ring
from shmbuf.core.layout import CTRL_BOOT
from shmbuf.ragged.jagged import Jagged

PAGE = 4096
OTHER_BOOT = durable.boot_id() ^ 0x5A5A


@pytest.fixture
def steady_lead(monkeypatch):
    """The horizons' leads stay a sixteenth, however fast the test writes."""
    monkeypatch.setattr(durable.Lead, "FAST", -1.0)


class Disk:
    """What the disk holds of ``buf``'s file: its bytes as the last flush left them, and
    every page an ``msync`` wrote since (the horizons' moves)."""

    def __init__(self, buf) -> None:
        self.seg = seg = buf.engine.seg
        self.size = seg.size
        self.bytes = bytearray(seg.mmap[:self.size])
        real = seg.sync

        def sync(start: int = 0, stop: int | None = None) -> None:
            real(start, stop)
            lo = start - start % PAGE
            hi = min(self.size, -(-(self.size if stop is None else stop) // PAGE) * PAGE)
            self.bytes[lo:hi] = seg.mmap[lo:hi]
        seg.sync = sync

    def memory(self) -> bytes:
        return bytes(self.seg.mmap[:self.size])


def rows_of(buf) -> tuple[dict, int]:
    """Every row ``buf`` holds, read with the checked read (its state), as a batch; and
    the rows its stamps show published (a sample may draw them)."""
    state = buf.state_dict()
    kept = np.flatnonzero(state["stamps"])
    batch = {k: state["data"][k][kept] for k in ("w", "i")}
    for k, (values, offsets) in state["ragged"].items():
        batch[k] = Jagged(values, offsets)
    stamps = buf.engine.ring.stamps
    return batch, int(np.count_nonzero((stamps > 0) & (stamps % 2 == 0)))


def check_image(path: str, image: bytes, flushed: set, must: set) -> str:
    """Open ``image`` (a restart), read every row: each must be whole, one the flush
    vouched for (``flushed``), and ``must`` among them; the run goes on (a new row, whole).
    Returns what is wrong ('' if nothing)."""
    with open(path, "wb") as f:
        f.write(image)
    with shmbuf.Buffer.attach(path) as buf:
        batch, held = rows_of(buf)
        keys = set(ragged_keys(batch).tolist())
        wrong = []
        if torn := ragged_torn(batch):
            wrong.append(f"{torn} torn rows")
        if len(batch["w"]) != held:
            wrong.append(f"{held - len(batch['w'])} rows counted but refused by the reader's check")
        if keys - flushed:
            wrong.append(f"rows the flush did not vouch for: {sorted(keys - flushed)}")
        if must - keys:
            wrong.append(f"rows lost: {sorted(must - keys)}")
        buf.extend(ragged_rows(5, 0, 2))
        after, _ = rows_of(buf)
        if ragged_torn(after) or not {5 * 10**9, 5 * 10**9 + 1} <= set(ragged_keys(after).tolist()):
            wrong.append("the run does not go on")
    return ", ".join(wrong)


def test_a_power_cut_leaves_ragged_rows_whole_or_absent_in_200_images(tmp_path, steady_lead):
    """A replay buffer whose lane's arena wraps: the writes after the flush cover the
    records of rows it vouched for. Cuts at every point of those writes (the ring's
    points and mid-record), images of each: every row read back is whole or absent."""
    path = str(tmp_path / "r.shmbuf")
    buf = shmbuf.Buffer.create(RAGGED_FIELDS, 256, path=path, arena=16 << 10)
    for i in range(40):  # (about 52 kB of records: the 16 kB arena wrapped three times)
        buf.add({k: v[0] for k, v in ragged_rows(1, i, i + 1).items()})
    buf.flush()
    flushed = set(ragged_keys(rows_of(buf)[0]).tolist())
    disk = Disk(buf)
    cuts = []

    def cut(where: str) -> None:
        cuts.append((f"row {len(cuts)} at {where}", bytes(disk.bytes), disk.memory()))
    ring.set_hook(cut)
    arena.HOOK = cut
    try:
        for i in range(40, 46):  # (about 8 kB: half a lap, over the flushed rows' records)
            buf.add({k: v[0] for k, v in ragged_rows(1, i, i + 1).items()})
        buf.extend(ragged_rows(1, 46, 48))
    finally:
        ring.set_hook(None)
        arena.HOOK = None
    covered = int(buf.engine.ring.records.heads[0, 0]) - buf.engine.ring.records.A
    boot = buf.engine.layout.control_offset + 8 * CTRL_BOOT
    buf.close()
    must = {1 * 10**9 + 39}  # (the newest row of the flush: no later write reaches its record)
    bad, images, seen = [], 0, {}
    for k, (name, on_disk, memory) in enumerate(cuts):
        for pages, image in power_cut_images(on_disk, memory, boot, OTHER_BOOT, limit=5, seed=k):
            images += 1
            if image not in seen:
                seen[image] = check_image(str(tmp_path / "image.shmbuf"), image, flushed, must)
            if seen[image]:
                bad.append((name, pages, seen[image]))
    assert covered > 0 and images >= 200 and len(seen) > 100 and not bad, (images, len(seen), bad[:5])


def restart(buf) -> None:
    """Make the next open of ``buf``'s file see another boot, then close ``buf``."""
    buf.engine.ring.control[CTRL_BOOT] = OTHER_BOOT
    buf.close()


def one(rows: dict, j: int = 0) -> dict:
    return {k: v[j] for k, v in rows.items()}


# -- the arena horizon ---------------------------------------------------------------

@pytest.mark.parametrize("shared", [False, True], ids=["owner", "shared"])
def test_the_arena_horizon_is_on_the_disk_before_any_record_is_placed_below_it(tmp_path, monkeypatch, shared,
                                                                               steady_lead):
    """Both kinds of writer (a lane's owner, a shared writer) place records only below
    the usable arena horizon; moving it writes the new value to the disk while the usable
    word still holds the old one."""
    from shmbuf.core.files import FileSegment
    buf = shmbuf.Buffer.create(RAGGED_FIELDS, 256, path=str(tmp_path / "b.shmbuf"), arena=16 << 10)
    records = buf.engine.ring.records
    h, word = records.heads[0], records.heads_at + 8  # (lane 0: H, on the disk, usable)
    if not shared:
        buf.claim_lane(0)
    seen = []
    real = FileSegment.sync

    def sync(self, start=0, stop=None):
        if start == word:
            seen.append((int(h[1]), int(h[2]), int(h[0])))
        real(self, start, stop)
    monkeypatch.setattr(FileSegment, "sync", sync)
    kw = {"lane": 0} if shared else {}
    for i in range(60):  # (about 78 kB of records: the horizon moves a sixteenth, 1 kB, past each write)
        buf.add(one(ragged_rows(1, i, i + 1)), **kw)
        assert h[0] <= h[2] <= h[1] <= h[0] + records.A // 16 + 2600
    assert len(seen) >= 30, seen
    for disk, usable, head in seen:
        assert head <= usable < disk  # on the disk first, usable after; no record placed past it


def test_an_interrupt_in_the_arena_horizons_msync_changes_nothing(tmp_path, monkeypatch, steady_lead):
    """A Ctrl-C that lands in the msync of the arena horizon's move (the slow part of a
    write under the lock) abandons the write before it evicts anything: the rows its
    records would have covered stay, and the next write goes on. (The replay storm in a
    file found it: a SIGINT there left a lane with its rows evicted and none written, a
    buffer empty to its samplers.)"""
    from shmbuf.core.files import FileSegment
    buf = shmbuf.Buffer.create({"t": ((None,), np.int64), "k": ((), np.int64)}, 64,
                               path=str(tmp_path / "b.shmbuf"), arena=8192)
    records = buf.engine.ring.records
    for k in range(8):  # (the arena full: 8 records of 1 kB)
        buf.add({"t": k * 1000 + np.arange(128), "k": k})
    before = (buf.engine.ring.lane_table[0, :2].tolist(), records.heads[0, :3].tolist(), len(buf))
    real = FileSegment.sync

    def sync(self, start=0, stop=None):
        if start == records.heads_at + 8:
            raise KeyboardInterrupt
        real(self, start, stop)
    monkeypatch.setattr(FileSegment, "sync", sync)
    with pytest.raises(KeyboardInterrupt):
        buf.add({"t": 8000 + np.arange(128), "k": 8})  # (its record covers row 0's: it would evict it)
    assert records.heads[0, 1] > before[1][1]  # (the interrupt came after the store, in the msync)
    assert (buf.engine.ring.lane_table[0, :2].tolist(), records.heads[0, [0, 2]].tolist(), len(buf)) == \
        (before[0], [before[1][0], before[1][2]], before[2])
    assert sorted(set(buf.sample(200)["k"].tolist())) == list(range(8))
    monkeypatch.setattr(FileSegment, "sync", real)
    buf.add({"t": 8000 + np.arange(128), "k": 8})
    got = buf.sample(200)
    assert sorted(set(got["k"].tolist())) == list(range(1, 9))
    assert all((got["t"][i] == k * 1000 + np.arange(128)).all() for i, k in enumerate(got["k"].tolist()))
    buf.unlink()
    buf.close()


def test_a_queue_arena_horizon_stays_in_its_room_so_a_restart_keeps_every_row_not_taken(tmp_path, monkeypatch):
    """A queue's arena horizon never passes its room (the record of its oldest row not
    yet taken, plus the lane's arena), however large its lead: the recovery, which drops
    the rows whose records a write up to that horizon may have covered, drops none of the
    rows not taken. Rows of 1 kB in an 8 kB arena, the lead doubled on every move."""
    monkeypatch.setattr(durable.Lead, "FAST", 1e9)  # (every move counts as fast: the lead grows to half the arena)
    path = str(tmp_path / "q.shmbuf")
    fields = {"t": ((None,), np.int64), "k": ((), np.int64)}
    q = shmbuf.Buffer.create(fields, 64, path=path, mode="queue", arena=8192)

    def row(k):
        return {"t": k * 1000 + np.arange(128), "k": k}
    records, lc = q.engine.ring.records, q.engine.ring.lane_capacity
    for k in range(4):
        q.add(row(k))
    assert q.take(4)["k"].tolist() == [0, 1, 2, 3]
    for k in range(4, 11):  # (7 kB: over the taken rows' records, up to the room)
        q.add(row(k))
        base = int(q.engine.ring.lane_table[0, 1])
        assert int(records.heads[0, 1]) <= int(records.table[base % lc]) + records.A
    q.flush()
    restart(q)
    back = shmbuf.Buffer.attach(path)
    t = back.take(64, partial=True, timeout=1)
    assert t["k"].tolist() == list(range(4, 11))
    assert all((t["t"][i] == k * 1000 + np.arange(128)).all() for i, k in enumerate(t["k"].tolist()))
    back.unlink()
    back.close()


# -- killed processes, then a restart ------------------------------------------------

@pytest.mark.parametrize("point,claim", [("locked", False), ("reserved", False), ("record", False),
                                         ("writing", False), ("published", False), ("record", True),
                                         ("wrap:record", False)])
def test_a_writer_killed_at_a_point_of_its_write_then_a_restart_leaves_whole_rows(tmp_path, point, claim):
    """A writer stopped at a point of its write (``wrap:``: of a write whose records
    start at the arena's start), SIGKILLed; another lane written; a flush; a restart:
    every row of the writes that returned is back, whole; the killed write's rows are
    back only if published; the run goes on."""
    from helpers import ragged_writer, read_log
    path = str(tmp_path / "w.shmbuf")
    log, stop, flag = (str(tmp_path / f) for f in ("log", "stop", "flag"))
    buf = shmbuf.Buffer.create(RAGGED_FIELDS, 256, lanes=2, path=path, arena=2 * (16 << 10))
    kill_when_there(ragged_writer, (path, 1, 0, None, log, stop, point, flag, 6, claim), flag,
                    f"the writer to stop at {point!r}", "fork", 120)
    buf.extend(ragged_rows(2, 0, 3), lane=1)
    buf.flush()
    pre, _ = rows_of(buf)
    pre = set(ragged_keys(pre).tolist())
    restart(buf)
    lines = read_log(log)
    returned = {10**9 + i for t, k in lines if t == "W" for i in range(int(k[0]), int(k[1]))}
    lo, hi = (int(x) for x in [k for t, k in lines if t == "A"][-1])
    hung = {10**9 + i for i in range(lo, hi)}
    back = shmbuf.Buffer.attach(path)
    batch, held = rows_of(back)
    keys = set(ragged_keys(batch).tolist())
    assert ragged_torn(batch) == 0 and len(batch["w"]) == held
    # the rows there before the restart, but the oldest of lane 0 (the price of the arena
    # horizon's lead: their records may have been covered); the newest there, and lane 1's
    assert keys <= pre and pre - keys == {k for k in pre if k < min(keys & (returned | hung))}
    assert sorted(returned)[-3:] and set(sorted(returned)[-3:]) <= keys and {2 * 10**9 + i for i in range(3)} <= keys
    assert keys & hung == (hung if point == "published" else set()) and pre & hung == keys & hung
    back.extend(ragged_rows(3, 0, 2), lane=0)
    after, _ = rows_of(back)
    assert ragged_torn(after) == 0 and {3 * 10**9, 3 * 10**9 + 1} <= set(ragged_keys(after).tolist())
    back.unlink()
    back.close()


@pytest.mark.parametrize("point,machine", [("claimed", False), ("copied", False), ("delivering", False),
                                           ("claimed", True), ("copied", True), ("delivering", True)])
def test_a_trainer_killed_mid_take_and_restarted_loses_no_row_and_takes_none_twice(tmp_path, point, machine):
    """A trainer takes 5 rows at a time from a queue in a file, flushing after each take
    (its checkpoint); its third take is SIGKILLed at ``point``. A new trainer (after a
    restart of the machine too, if ``machine``) takes the rest: every row once, whole.
    (A take killed after its delivery committed, "delivered", took its rows with it, as
    a queue's take of fixed rows does: the queue's base moved past them, with or without
    a restart; not tested here.)"""
    from helpers import ragged_consumer, read_log
    path = str(tmp_path / "q.shmbuf")
    log, flag = str(tmp_path / "log"), str(tmp_path / "flag")
    q = shmbuf.Buffer.create(RAGGED_FIELDS, 64, lanes=2, path=path, mode="queue", arena=2 * (32 << 10))
    q.extend(ragged_rows(1, 0, 12), lane=0)
    q.extend(ragged_rows(2, 0, 12), lane=1)
    every = {w * 10**9 + i for w in (1, 2) for i in range(12)}
    kill_when_there(ragged_consumer, (path, log, 5, point, flag, 2), flag, f"the trainer to stop at {point!r}",
                    "fork", 120)
    if machine:
        restart(q)
        q = shmbuf.Buffer.attach(path)
    lines = read_log(log)
    assert not [k for t, k in lines if t == "X"]
    got = [int(x) for t, k in lines if t == "D" for x in k]
    assert len(got) == 10  # (two takes returned before the killed one)
    deadline = time.monotonic() + 60
    while len(got) < len(every) and time.monotonic() < deadline:  # (a dead taker's rows: given back)
        try:
            b = q.take(64, partial=True, timeout=1)
        except shmbuf.SampleTimeout:
            continue
        assert ragged_torn(b) == 0
        got += ragged_keys(b).tolist()
    assert sorted(got) == sorted(every)  # every row, once
    with pytest.raises(shmbuf.SampleTimeout):
        q.take(1, partial=True, timeout=0.2)
    q.unlink()
    q.close()
