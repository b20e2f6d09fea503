"""Ragged rows in a buffer file (``path=``): what a power loss keeps, what a killed
process costs (see shmbuf.core.arena, "In a buffer file", and shmbuf.core.durable).

A power loss is simulated on the file's bytes: the disk holds the file as the last flush
left it, plus every page written to it since by an explicit ``msync`` (the horizons'),
plus any combination of the other pages changed since (the kernel writes pages back in
no order); the header's boot id is another boot's, so the next open recovers."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time

import numpy as np
import pytest

import shmbuf
from helpers import RAGGED_FIELDS, power_cut_images, ragged_keys, ragged_rows, ragged_torn, wait_for_file
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
    the rows it counts (``len``)."""
    state = buf.state_dict()
    kept = np.flatnonzero(state["stamps"])
    batch = {k: state["data"][k][kept] for k in ("w", "i")}
    for k, (values, offsets) in state["ragged"].items():
        batch[k] = Jagged(values, offsets)
    return batch, len(buf)


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
