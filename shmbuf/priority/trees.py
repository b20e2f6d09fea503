"""Proportional prioritized replay (Schaul et al. 2016) shared by every process of a buffer.

A row is drawn with probability ``P(i) = p_i**a / sum_j p_j**a`` and weighted by
``(N * P(i))**-b / max_j (N * P(j))**-b = (min_j p_j**a / p_i**a)**b`` (the largest
weight is the minimum priority's, over the whole buffer). Everything lives in a region
of the segment, next to the rows::

    head        version (a seqlock: odd while a tree is being changed), the largest
                priority ever set, spare words
    lanes       per lane: rows below ``synced`` are in the trees; the lane base they saw
    sum tree    2P float64, P the power of two >= capacity: leaf P + slot holds p**a
    min tree    2P float64, the same leaves; 0 means "no row" (the minimum of the rest)
    leaf seq    per slot: 1 + the sequence number of the row its leaf is for (0: none)

**Writers never touch the trees** (a writer killed anywhere cannot break them). A row
carries its writer's priority in a hidden field, ``_priority`` (0: the largest ever set);
every sample and update first *syncs*: under the header lock it reads the rows published
since the last sync (through the read path's checked gather) and sets their leaves. So a row enters the trees before anyone can
draw it by priority, and a slot's leaf always says which row (sequence number) it is
for. An ``index`` handle of a sample is ``(slot, seq)``; an update for a slot whose
leaf is now for another row (overwritten since) is dropped, never applied to the new
row.

Changing the trees takes the header lock and bumps the version before and after.
Samplers do not lock: they descend the sum tree and read the leaves and their sequence
numbers between two equal even versions, then copy the rows through the read path at
exactly those sequence numbers, so a row and its priority and weight refer to the same
write. A change killed halfway leaves the version odd: the next to take the lock (or a
sampler that sees it odd for long) rebuilds the inner nodes from the leaves. The tree
work is vectorised level by level, in C when the extension is there.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping

import numpy as np

from shmbuf.core import gather, native
from shmbuf.core.batch import rows_of
from shmbuf.core.deadline import Deadline
from shmbuf.core.read import SampleTimeout
from shmbuf.core.seqlock import read_stable
from shmbuf.core.engine import Engine
from shmbuf.core.segment import FormatError
from shmbuf.priority.values import (DEFAULT_BETA, LARGEST, check_alpha, check_beta, check_values,  # noqa: F401
                                    largest_leaf, leaves)

REGION = "priority"
FIELD = "_priority"
_HEAD_WORDS = 8
H_VERSION, H_MAX = 0, 1  # H_MAX: float64 bits; 0.0 reads as 1.0 (no priority set yet)
HOOK: Callable[[str], None] | None = None
"""Test hook, called in every change of the trees (the lock held, the version odd) at
"changing" (nothing changed yet), "leaves" (leaves set, their ancestors not yet; the
native path's update of a few leaves sets both at once, then calls it) and "changed"
(all done, the version not yet even). Never set outside tests."""


def region_bytes(capacity: int, lanes: int) -> int:
    return 8 * (_HEAD_WORDS + 2 * lanes + 4 * leaves(capacity) + capacity)


class Trees:
    """Views on a buffer's priority region, and the operations on them."""

    def __init__(self, engine: Engine, meta: Any) -> None:
        layout, mem = engine.layout, engine.seg.mmap
        off, size = layout.regions.get(REGION, (0, 0))
        field = {f.name: f for f in layout.fields}.get(FIELD)
        try:
            alpha = check_alpha(meta.get("alpha") if isinstance(meta, dict) else None)
        except ValueError as exc:
            raise FormatError(f"buffer {engine.name!r}: bad priority settings: {exc}") from None
        if size != region_bytes(layout.capacity, layout.lanes) or field is None \
                or (field.shape, field.dtype) != ((), np.dtype(np.float64)):
            raise FormatError(f"buffer {engine.name!r} is prioritized but its priority region ({size} bytes) "
                              f"or field ({field}) is not the one its capacity and lanes need")
        self.alpha, self.engine, self.ring, self.lock = alpha, engine, engine.ring, engine.lock
        self.capacity, self.lanes, self.lc = layout.capacity, layout.lanes, layout.lane_capacity
        self.leaves = P = leaves(layout.capacity)  # leaf i of the trees is node leaves + i
        self.head = np.ndarray((_HEAD_WORDS,), np.int64, mem, off)
        self.headf = self.head.view(np.float64)
        off += 8 * _HEAD_WORDS
        self.synced = np.ndarray((layout.lanes, 2), np.int64, mem, off)  # [synced, base seen]
        off += 16 * layout.lanes
        self.sum = np.ndarray((2 * P,), np.float64, mem, off)
        self.min = np.ndarray((2 * P,), np.float64, mem, off + 16 * P)
        self.seq = np.ndarray((layout.capacity,), np.int64, mem, off + 32 * P)
        self._native = native.extension() if engine.native is not None else None

    def check(self, priorities: Any, n: int | None, what: str) -> np.ndarray:
        """:func:`check_values` with this buffer's exponent and capacity."""
        return check_values(priorities, n, what, self.alpha, self.capacity)

    # -- changing the trees (under the lock) ----------------------------------------

    def change(self, timeout: float) -> "_Change":
        """``with trees.change(timeout):`` the lock held and the version odd."""
        return _Change(self, timeout)

    def set(self, slots: np.ndarray, values: np.ndarray) -> None:
        """Leaves ``slots`` to ``values`` (p**a; the last of repeated slots wins) and
        their ancestors."""
        if not len(slots):
            return
        if len(slots) > self.leaves // 8:  # many (a learner's first sync): every node, once
            self.sum[slots + self.leaves] = values
            self.min[slots + self.leaves] = values
            if HOOK is not None:
                HOOK("leaves")
            self.rebuild()
            return
        if self._native is not None:
            self._native.tree_set(self.sum, self.min, np.ascontiguousarray(slots, np.int64),
                                  np.ascontiguousarray(values, np.float64))
            if HOOK is not None:
                HOOK("leaves")
            return
        nodes = slots + self.leaves
        self.sum[nodes] = values
        self.min[nodes] = values
        if HOOK is not None:
            HOOK("leaves")
        while nodes[0] > 1:
            nodes = np.unique(nodes >> 1)
            left, right = 2 * nodes, 2 * nodes + 1
            self.sum[nodes] = self.sum[left] + self.sum[right]
            self.min[nodes] = _nonzero_min(self.min[left], self.min[right])

    def rebuild(self) -> None:
        """Every inner node from the leaves (after a process died changing them)."""
        lo = self.leaves
        while lo > 1:
            left, right = self.sum[lo:2 * lo:2], self.sum[lo + 1:2 * lo:2]
            self.sum[lo // 2:lo] = left + right
            self.min[lo // 2:lo] = _nonzero_min(self.min[lo:2 * lo:2], self.min[lo + 1:2 * lo:2])
            lo //= 2

    def sync(self) -> None:
        """Give the rows published since the last sync their leaves (lock held): the new
        rows of every lane in one pass, their leaves in one tree update.

        The order makes a death anywhere harmless: the leaves (and their ancestors) are
        set first, then the leaf sequence numbers, and ``synced`` moves last (the
        commit); a sync killed before the commit is done again by the next one, which
        also rebuilds the inner nodes (the version was left odd). An unpublished row holds
        ``synced`` back only while a live writer may still publish it: a row that a dead
        writer reserved, or an abandoned write's, is passed over for good, so it never
        makes every later sync read a whole lap again. A slot whose new row is not
        published (being written, or never to be) loses the leaf of the row it held, now
        outside the window: no draw lands there until the new row is synced."""
        ring, lc = self.ring, self.lc
        heads, bases = self.engine.heads(), self.engine.bases()
        for lane in np.flatnonzero((bases != self.synced[:, 1]) | (self.synced[:, 0] > heads)).tolist():
            # cleared, restored or rolled back by a restart (shmbuf.core.durable): its rows
            # are gone (the ones written since, or kept: synced again, at their writers' priority)
            slots = np.arange(lane * lc, (lane + 1) * lc)
            self.set(slots, np.zeros(lc))
            self.seq[slots] = 0
            self.synced[lane] = bases[lane], bases[lane]
        synced = self.synced[:, 0]  # (a view: written last)
        first = np.maximum(np.maximum(synced, heads - lc), bases)
        count = np.maximum(heads - first, 0)
        total = int(count.sum())
        if not total:
            return
        lanes = np.flatnonzero(count)
        count = count[lanes]
        lane = np.repeat(lanes, count)
        rows = np.repeat(first[lanes] - np.cumsum(count) + count, count) + np.arange(total)
        slots = lane * lc + rows % lc
        p, ok = self._read(lane, rows)  # through the read path's checked gather
        low = heads.copy()  # each lane: synced up to its first row a live writer still holds
        if not ok.all():
            late = np.flatnonzero(~ok)
            held = ring.held(lane[late], rows[late])
            again = late[~held]  # finished since (published now, or never)
            p[again], ok[again] = self._read(lane[again], rows[again])
            np.minimum.at(low, lane[late[held]], rows[late[held]])
            gone = late[~ok[late]]  # unpublished: their slots' older rows left the window
            gone = gone[(self.seq[slots[gone]] > 0) & (self.seq[slots[gone]] <= rows[gone])]
            if len(gone):  # (their leaves out: a draw of them would be redrawn, the mass stuck there)
                self.set(slots[gone], np.zeros(len(gone)))
                self.seq[slots[gone]] = 0
        new = ok & (self.seq[slots] <= rows)  # (a later row's leaf is never set back)
        if new.any():
            top = self.headf[H_MAX] or 1.0
            given = p[new]  # > 0: the writer's; 0: the largest; < 0: none (an episode's final row)
            self.set(slots[new], np.where(given > 0, given, np.where(given < 0, 0.0, top)) ** self.alpha)
            self.seq[slots[new]] = rows[new] + 1
            self.headf[H_MAX] = max(top, float(given.max()))
        synced[lanes] = low[lanes]  # the commit

    def _read(self, lane: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The priority fields of the rows ``(lane, rows)``, and which were read intact
        (published, and unchanged during the read: :func:`gather.copy_windows`)."""
        p = np.empty(len(rows))
        if not len(rows):
            return p, np.ones(0, bool)
        ok = gather.copy_windows(self.ring, lane, rows, 1, None, [p if f.name == FIELD else None
                                                                    for f in self.ring.layout.fields])
        return p, np.ones(len(rows), bool) if ok is None else np.array(ok)  # (a mask of our own)

    def update(self, slots: np.ndarray, seqs: np.ndarray, p: np.ndarray) -> int:
        """Set the leaves of the rows ``(slots, seqs)`` still there (lock held)."""
        ok = self.seq[slots] == seqs + 1
        if ok.any():
            self.set(slots[ok], p[ok] ** self.alpha)
            self.headf[H_MAX] = max(self.headf[H_MAX], float(p[ok].max()))
        return int(ok.sum())

    # -- saving and restoring them ---------------------------------------------------

    def snapshot(self, timeout: float) -> tuple[np.ndarray, np.ndarray, float]:
        """The leaves ``p**a`` and leaf sequence numbers, each leaf read together with
        its sequence number (a seqlock read, chunk by chunk; a chunk that keeps changing
        is read under the lock, all within ``timeout``), and the largest priority set."""
        cap, first, deadline = self.capacity, self.leaves, Deadline(timeout)
        leaf, seq = np.empty(cap), np.empty(cap, np.int64)
        chunk = 1 << 15
        for lo in range(0, cap, chunk):
            hi = min(lo + chunk, cap)

            def read() -> None:
                leaf[lo:hi] = self.sum[first + lo:first + hi]
                seq[lo:hi] = self.seq[lo:hi]
            stable, _ = read_stable(lambda: int(self.head[H_VERSION]), read)
            if not stable:
                with self.change(deadline.left()):
                    read()
        return leaf, seq, float(self.headf[H_MAX])

    def restore(self, leaf: np.ndarray, stamps: np.ndarray, top: float, timeout: float) -> None:
        """The leaves of saved rows (``stamps``: each slot's saved stamp, 0 for none; NaN
        leaves: rows saved before they were synced, which get theirs from their
        ``_priority`` at the next sync, as they would have), after a load."""
        rows = stamps // 2 - 1
        given = np.flatnonzero((stamps > 0) & ~np.isnan(leaf))
        with self.change(timeout):
            bases = self.engine.bases()
            self.headf[H_MAX] = top
            self.seq[given] = rows[given] + 1
            self.set(given, leaf[given])
            self.synced[:, 1] = bases  # base seen: the loaded bases
            self.synced[:, 0] = bases  # the rest synced from the base up

    # -- reading them (no lock) ------------------------------------------------------

    def pick(self, rng: np.random.Generator, n: int, deadline: float,
             timeout: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, float, np.ndarray]:
        """Sync, then :meth:`draw`: ``(slots, leaves, seqs, smallest leaf, drawn)``, where
        ``drawn`` is False where rounding reached an empty leaf (its seq reads 0)."""
        with self.change(max(0.0, deadline - time.monotonic())):
            self.sync()
        slots, p, seq, least = self.draw(rng, n, deadline, timeout)
        drawn = (p > 0) & (seq >= 0)
        np.maximum(seq, 0, out=seq)
        return slots, p, seq, least, drawn

    def draw(self, rng: np.random.Generator, n: int, deadline: float,
             timeout: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
        """``n`` slots drawn by priority, with their leaves, their rows' sequence
        numbers (-1: none) and the smallest leaf, all of one version of the trees."""
        delay = 20e-6
        while True:
            v = int(self.head[H_VERSION])
            if not v & 1:
                total, low = float(self.sum[1]), float(self.min[1])
                if total <= 0 and int(self.head[H_VERSION]) == v:  # (before drawing: the RNG stays)
                    raise ValueError("cannot sample from an empty buffer: add rows first")
                u = rng.random(n)
                u *= total
                if self._native is not None:
                    slots, p, seq = np.empty(n, np.int64), np.empty(n), np.empty(n, np.int64)
                    self._native.tree_find(self.sum, u, slots, p, self.seq, seq)
                else:
                    slots = np.minimum(self._find(u), self.capacity - 1)  # (rounding: past the rows)
                    p, seq = self.sum[slots + self.leaves], self.seq[slots]
                seq -= 1
                if int(self.head[H_VERSION]) == v and total > 0:
                    return slots, p, seq, low
            if time.monotonic() >= deadline:
                raise SampleTimeout(
                    f"the priority trees kept changing (or a process stopped while changing them "
                    f"holds the header lock) for {timeout:g} s")
            if v & 1 and delay >= 1e-3:  # odd for long: its changer may be dead; repair
                with self.change(max(0.0, deadline - time.monotonic())):
                    pass
            time.sleep(delay)
            delay = min(2 * delay, 5e-3)

    def _find(self, u: np.ndarray) -> np.ndarray:
        """The leaves where the prefix sums reach ``u``, level by level."""
        node = np.ones(len(u), np.int64)
        s = self.sum
        while node[0] < self.leaves:
            left = 2 * node
            mass = s[left]
            right = u >= mass
            u = np.where(right, u - mass, u)
            node = left + right
        return node - self.leaves

    # -- the part's operations (shmbuf.core.plain: NoPriorities is the plain one) ----------

    def stamp(self, data: Any, priority: Any, axis: int | None) -> dict[str, Any]:
        """``data`` (of ``add``: ``axis`` None, or ``extend``: 0) with the hidden priority
        field (0: the largest priority ever set)."""
        if not isinstance(data, Mapping):
            raise TypeError(f"expected a mapping of field names to values, got {type(data).__name__}")
        if FIELD in data:
            raise ValueError(f"{FIELD!r} is kept by shmbuf: pass priority= instead")
        if axis is None:
            p: Any = 0.0 if priority is None else float(self.check(priority, 1, "priority")[0])
        else:
            rows = rows_of(data)
            if priority is None:
                p = np.zeros(rows)
            else:
                p = self.check(priority, None, "priority")
                if p.shape != (rows,):  # one for all (or a bad shape: the schema check says so)
                    p = np.full(rows, p.reshape(-1)[0]) if p.size == 1 else p
        return {**data, FIELD: p}

    def leaf_values(self, slots: np.ndarray) -> np.ndarray:
        """The ``p**a`` the trees hold now for ``slots`` (no lock: read right after a
        sample, by the only process that changes the trees, they are the values drawn)."""
        return self.sum[self.leaves + np.asarray(slots, np.int64)]

    def totals(self, timeout: float) -> tuple[float, float]:
        """The buffer's priority mass ``sum p**a`` and smallest ``p**a`` (0.0, 0.0 if
        empty), its newest rows included (synced first): what a sampler over several buffers
        (``shmbuf.ray``) draws its per-buffer counts and weights by."""
        with self.change(timeout):
            self.sync()
            return float(self.sum[1]), float(self.min[1])

    def update_priorities(self, index: Any, priorities: Any, timeout: float) -> int:
        """Set the priorities of the rows ``index`` (as a sample gave it: slot, row) that still
        hold those rows; how many were set."""
        idx = np.asarray(index)
        if idx.ndim != 2 or idx.shape[1] != 2 or idx.dtype.kind not in "iu":
            raise ValueError(f"index must be the (n, 2) integer array sample() returned as 'index' (slot, row), "
                             f"got {idx.dtype} {idx.shape}")
        p = self.check(priorities, len(idx), "update_priorities")
        slots, seqs = idx[:, 0].astype(np.int64), idx[:, 1].astype(np.int64)
        if len(slots) and (slots.min() < 0 or slots.max() >= self.capacity):
            raise ValueError(f"index: slots must be in [0, {self.capacity}); was it sampled from another buffer?")
        with self.change(timeout):
            self.sync()  # rows published since: their slots' leaves are theirs now
            return self.update(slots, seqs, p)


class _Change:
    """The header lock held (Ctrl-C held off while it is: see ``HeaderLock.hold``), the
    trees' version odd while they change."""
    __slots__ = ("trees", "held")

    def __init__(self, trees: Trees, timeout: float) -> None:
        self.trees, self.held = trees, trees.lock.hold(timeout)

    def __enter__(self) -> Trees:
        t = self.trees
        self.held.__enter__()
        try:
            v = int(t.head[H_VERSION])
            if v & 1:  # its last changer died inside: the leaves are right, the rest may not be
                t.rebuild()
                v += 1
            t.head[H_VERSION] = v + 1
            if HOOK is not None:
                HOOK("changing")
        except BaseException:
            self.held.__exit__()
            raise
        return t

    def __exit__(self, kind: object, *exc: object) -> None:
        t = self.trees
        try:
            if kind is None:  # (an exception inside: left odd, the next changer rebuilds)
                if HOOK is not None:
                    HOOK("changed")
                t.head[H_VERSION] += 1
        finally:
            self.held.__exit__()


def _nonzero_min(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise min, where 0 stands for "no row" (so min(0, x) is x)."""
    return np.where(a == 0, b, np.where(b == 0, a, np.minimum(a, b)))
