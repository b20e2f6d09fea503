"""The lane and reservation tables: the checks of what a segment's tables hold, and
who holds a reservation."""

from __future__ import annotations

from typing import Any

import numpy as np

from shmbuf.core.layout import (LANE_BASE, LANE_CLAIM_PID, LANE_EPISODES, LANE_FLUSHED, LANE_HEAD, LANE_OWN_COUNT, LANE_OWN_START,
                     MAX_SEQ, RES_COUNT, RES_CTIME, RES_LANE, RES_PID, RES_START, TABLE_WIDTH, Layout)
from shmbuf.core.segment import FormatError


def owners(res: np.ndarray, entries: Any) -> list[tuple[int, float]]:
    """(pid, start time) of the writers holding ``entries`` of a reservation-table copy."""
    ctimes = res.view(np.float64)[:, RES_CTIME]
    return [(int(res[i, RES_PID]), float(ctimes[i])) for i in entries]


def check_tables(layout: Layout, mem: Any, name: str) -> None:
    """Raise :class:`~shmbuf.FormatError` unless the lane and reservation tables of a
    mapped segment hold words a shmbuf process can have written (read once, at attach:
    every number the protocol later computes from them then stays in range).

    Per lane: ``0 <= base <= head <= MAX_SEQ``, a claimer's pid >= 0, an owner's write
    in flight of 0 to ``lane_capacity`` rows at a sequence number in range; per
    reservation in use: a lane of the buffer, a start in range, 1 to ``lane_capacity``
    rows."""
    lanes = np.ndarray((layout.lanes, TABLE_WIDTH), np.int64, mem, layout.lanes_offset).copy()
    res = np.ndarray((layout.n_reservations, TABLE_WIDTH), np.int64, mem, layout.reservations_offset).copy()
    lc = layout.lane_capacity

    def bad(what: str, where: np.ndarray, column: np.ndarray) -> None:
        if where.any():
            i = int(np.flatnonzero(where)[0])
            raise FormatError(f"shared-memory segment {name!r} is not a usable shmbuf buffer: {what} "
                              f"{i} holds {int(column[i])}, which no shmbuf process writes")

    head, base = lanes[:, LANE_HEAD], lanes[:, LANE_BASE]
    bad("the head of lane", (head < 0) | (head > MAX_SEQ), head)
    bad("the base of lane", (base < 0) | (base > head), base)
    bad("the claimer of lane", lanes[:, LANE_CLAIM_PID] < 0, lanes[:, LANE_CLAIM_PID])
    count, start = lanes[:, LANE_OWN_COUNT], lanes[:, LANE_OWN_START]
    bad("the owner's write in flight (rows) of lane", (count < 0) | (count > lc), count)
    bad("the owner's write in flight (start) of lane", (count > 0) & ((start < 0) | (start > MAX_SEQ)), start)
    bad("the episode count of lane", lanes[:, LANE_EPISODES] < 0, lanes[:, LANE_EPISODES])
    flushed = lanes[:, LANE_FLUSHED]
    bad("the flush frontier of lane", (flushed < 0) | (flushed > MAX_SEQ), flushed)
    pid = res[:, RES_PID]
    bad("the pid of reservation", pid < 0, pid)
    used = pid != 0
    bad("the lane of reservation", used & ((res[:, RES_LANE] < 0) | (res[:, RES_LANE] >= layout.lanes)),
        res[:, RES_LANE])
    bad("the start of reservation", used & ((res[:, RES_START] < 0) | (res[:, RES_START] > MAX_SEQ)),
        res[:, RES_START])
    bad("the row count of reservation", used & ((res[:, RES_COUNT] < 1) | (res[:, RES_COUNT] > lc)),
        res[:, RES_COUNT])


class QueueFull(Exception):
    """A queue's reservation that would overwrite rows not yet taken (nothing reserved)."""


class BeyondHorizon(Exception):
    """A buffer file's write that would reserve past its lane's horizon (nothing reserved):
    :class:`shmbuf.core.durable.Horizon` moves it, then the write is made again."""


def check_head(lane: int, first: int, n: int, horizon: Any = None) -> None:
    """FormatError if ``first``, a lane's head, cannot be one (the native path's check);
    BeyondHorizon if ``first + n`` is past a buffer file's usable ``horizon``."""
    if horizon is not None and first + n > horizon[lane, 1]:
        raise BeyondHorizon(lane)
    if not 0 <= first <= MAX_SEQ - n:
        raise FormatError(f"lane {lane}'s head is {first}, not a sequence number in [0, 2**62): the "
                          "segment's lane table was not written by shmbuf; nothing was written. Create "
                          "a new buffer")
