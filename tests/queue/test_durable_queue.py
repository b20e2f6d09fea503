"""A queue in a buffer file after a power loss: every file the disk can hold when the
power goes at a chosen point of a take (or after it), between two durability points
(the last flush and the next), is opened and taken from.

The kernel writes a file's changed pages back in no order, so the queue's words, its
journal and the rows' stamps can reach the disk each as they were at the flush or at
the cut. Whatever reached it, a restart must deliver every row that no take returned
(rows of a take whose delivery was committed may come again or not), never a row
delivered before the flush, nor a stale row passed over between a take's rows before
it, and never, to a take with the same bound, a stale row."""

from __future__ import annotations

import threading

import pytest

import shmbuf
from helpers import QUEUE_FIELDS, keys, power_cut_images, queue_rows
from shmbuf.core import durable
from shmbuf.queue import protocol as queue_protocol
from shmbuf.core.layout import CTRL_BOOT

BOUND = 100
# (lanes, rows: "F" fresh (version BOUND) or "S" stale (version 1) with their lanes, takes before the
# flush: (n, bound), its rows given back by an exception, or in flight across the flush; takes after
# it: (n, bound)); row i is key 9 * 10**9 + i (fresh) or 8 * 10**9 + i (stale)
HISTORIES = {
    "one lane, stale rows between": (1, "F0 S0 F0 S0 S0 F0 S0 F0 F0 S0 S0 F0", [(2, BOUND)], [(4, BOUND)]),
    "a plain take last before the flush": (2, "S1 F0 F1 S0 F1 F0", [(1, None)], [(1, BOUND), (2, BOUND)]),
    "two lanes, stale rows in both": (2, "F0 S0 S0 F1 S1 S0 F0 F0 S1 S0 F0 F0 S0", [(1, BOUND)], [(3, BOUND)]),
    "rows given back before the flush, taken after it": (1, "F0 S0 F0 F0 S0 F0", [(3, BOUND, "given back")],
                                                          [(1, BOUND), (1, BOUND)]),
    "a take in flight across the flush": (1, "F0 F0 S0 F0 F0 F0 S0 F0", [(2, BOUND, "in flight"), (2, BOUND)],
                                          [(2, BOUND)]),
}
# a take's points (see shmbuf.queue.protocol.HOOK); from its delivery's commit on, its rows may be lost
POINTS = ["commit@claim", "claimed", "copied", "delivering", "commit@delivery", "delivered"]
DELIVERED = {"commit@delivery", "delivered"}


def take_all(path: str, bound: int | None) -> list[int]:
    with shmbuf.Buffer.attach(path) as q:
        got = []
        while True:
            try:
                got += keys(q.take(16, partial=True, timeout=0, min_version=bound)).tolist()
            except shmbuf.SampleTimeout:
                return got


def run(tmp_path, history: str):
    """Write the rows, take, flush, take again, flush again: the rows fresh and stale,
    those taken or passed over before the flush, the file as the flush left it, the
    memory (and what may be lost there) at every point of the takes after the flush and
    inside the next flush (its snapshot taken, nothing on the disk yet), where the boot
    id is."""
    lanes, rows, first, then = HISTORIES[history]
    path = str(tmp_path / "q.shmbuf")
    q = shmbuf.Buffer.create(QUEUE_FIELDS, 16 * lanes, lanes=lanes, path=path, mode="queue", versions=True)
    old = shmbuf.Buffer.attach(path)
    rows = rows.split()
    for i, (c, lane) in enumerate(rows):
        (q if c == "F" else old).extend(queue_rows(9 if c == "F" else 8, i, i + 1), version=BOUND if c == "F" else 1,
                                        lane=int(lane))
    old.close()
    fresh = {9 * 10**9 + i for i, (c, _) in enumerate(rows) if c == "F"}
    stale = {8 * 10**9 + i for i, (c, _) in enumerate(rows) if c == "S"}
    before, late, flight = [], [], None
    for n, bound, *how in first:
        if how == ["given back"]:  # (an exception in the take: its rows given back at once)
            def hook(where: str, _rows) -> None:
                if where == "claimed":
                    raise RuntimeError("given back")
            queue_protocol.HOOK = hook
            with pytest.raises(RuntimeError, match="given back"):
                q.take(n, partial=True, min_version=bound)
            queue_protocol.HOOK = None
        elif how == ["in flight"]:  # (stopped at "claimed" until after the flush, in a thread)
            there, go = threading.Event(), threading.Event()

            def hook(where: str, _rows) -> None:
                if where == "claimed" and threading.current_thread() is flight:
                    there.set()
                    go.wait(60)
            queue_protocol.HOOK = hook
            flight = threading.Thread(target=lambda: late.extend(keys(q.take(n, partial=True, min_version=bound))))
            flight.start()
            assert there.wait(60)
        else:
            before += keys(q.take(n, partial=True, min_version=bound)).tolist()
    nxt = q.engine.writes.next.tolist()  # (rows below it were taken or passed over before the flush)
    seq = [sum(1 for c, lane in rows[:i] if lane == rows[i][1]) for i in range(len(rows))]
    before += [8 * 10**9 + i for i, (c, lane) in enumerate(rows) if c == "S" and seq[i] < nxt[int(lane)]]
    q.flush()
    if flight is not None:
        go.set()
        flight.join(60)
        queue_protocol.HOOK = None
    with open(path, "rb") as f:
        flushed = f.read()
    cuts, taken, point = [], [set(late)], [0]

    def hook(where: str, _rows) -> None:
        name = POINTS[point[0]] if where == "commit" or POINTS[point[0]] == where else where
        point[0] += 1
        may_lose = set().union(*taken) | (set() if name not in DELIVERED else {"this take"})
        cuts.append((f"take {len(taken) - 1} at {name}", bytes(q.engine.seg.mmap[:len(flushed)]), may_lose))
    queue_protocol.HOOK = hook
    try:
        for n, bound in then:
            point[0] = 0
            got = keys(q.take(n, partial=True, min_version=bound)).tolist()
            cuts[:] = [(c, m, (lose - {"this take"}) | (set(got) if "this take" in lose else set()))
                       for c, m, lose in cuts]
            taken.append(set(got))
    finally:
        queue_protocol.HOOK = None
    cuts.append(("returned", bytes(q.engine.seg.mmap[:len(flushed)]), set().union(*taken)))
    seg, sync = q.engine.seg, q.engine.seg.sync

    def syncing(*args) -> None:  # (the next flush's first write to the disk: its snapshot is taken)
        if len(cuts) and cuts[-1][0] != "flushing":
            cuts.append(("flushing", bytes(seg.mmap[:len(flushed)]), set().union(*taken)))
        sync(*args)
    seg.sync = syncing
    q.flush()
    del seg.sync
    boot = q.engine.layout.control_offset + 8 * CTRL_BOOT
    q.close()
    return fresh, stale, set(before), flushed, cuts, boot


@pytest.mark.parametrize("history", list(HISTORIES))
def test_a_power_loss_in_lag_limited_takes_loses_no_fresh_row_and_delivers_no_stale_one(tmp_path, history):
    fresh, stale, before, flushed, cuts, boot = run(tmp_path, history)
    bad, images, seen = [], 0, {}
    for cut, memory, may_lose in cuts:
        owed = fresh - before - may_lose
        for pages, image in power_cut_images(flushed, memory, boot, durable.boot_id() ^ 0x5A5A):
            images += 1
            for bound in (BOUND, None):
                if (image, bound) not in seen:  # (cuts where nothing changed give the same files)
                    path = str(tmp_path / "image.shmbuf")
                    with open(path, "wb") as f:
                        f.write(image)
                    seen[image, bound] = take_all(path, bound)
                got = seen[image, bound]
                wrong = {"lost": sorted(owed - set(got)), "twice": len(got) - len(set(got)),
                         "again": sorted(set(got) & before), "stale": sorted(set(got) & stale) if bound else [],
                         "unknown": sorted(set(got) - fresh - stale)}
                if any(wrong.values()):
                    bad.append((cut, pages, bound, {k: v for k, v in wrong.items() if v}))
    assert images > len(cuts) and not bad, bad
