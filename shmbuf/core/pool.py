"""Batch memory that stays mapped: the arrays a call returns, reused once they are gone.

A batch of atari frames is 14 MB. ``np.empty`` takes memory that size from the system
(``mmap``) and ``free`` gives it back (``munmap``), so every call that makes a fresh batch
faults its pages in again: about half the time of a default ``sample(256)``. The pool
keeps that memory mapped instead. Every array of one batch is a view of one *block* (one
allocation per batch, each array aligned to 64 bytes); a block is free again once no
array, view, tensor or buffer made from it is alive, which CPython's reference count of
the block says exactly (every view holds its block as its ``base``). A block is never
handed out while anything made from it lives.

Bounded: the pool holds at most :func:`limit` bytes of blocks in a process (default
256 MiB, ``SHMBUF_POOL_BYTES``; 0 turns it off); a free block serves requests of half its
size up, and free blocks go, oldest first, when a new one would pass the limit. Every
look at the blocks takes the pool's lock (a look holds a block for a moment, which would
make it seem in use). A batch that does not fit beside the live ones,
or under 256 KiB (the allocator keeps those mapped already), is a plain ``np.empty``.
One pool serves every handle of a process (a learner sampling two buffers shares one
bound); it is safe across threads and across ``fork``.

Examples:
    >>> import numpy as np
    >>> a, b = empty([((1024, 256), np.float32), ((1024,), np.int64)])
    >>> a.base is b.base, a.ctypes.data % 64
    (True, 0)
    >>> c, = empty([((1024, 256), np.float32)])
    >>> np.shares_memory(a, c)  # a lives: its memory is not handed out
    False
"""

from __future__ import annotations

import math
import os
import sys
import threading
from typing import Any, Iterable, Sequence

import numpy as np

ALIGN = 64
SMALL = 1 << 18
"""Batches smaller than this come from ``np.empty`` (malloc's heap keeps them mapped)."""

Spec = tuple[tuple[int, ...], Any]


class Pool:
    """Blocks of uint8 (each ``ALIGN`` bytes longer than it serves, to align its start),
    each free when only the pool refers to it. ``limit``: the most bytes held at once."""

    def __init__(self, limit: int) -> None:
        self.limit = int(limit)
        self.blocks: list[np.ndarray] = [np.empty(0, np.uint8)]
        self.idle = self.refs(0)  # the reference count of a block nothing else uses (a probe's, once)
        self.blocks.clear()
        self.lock = threading.Lock()  # (every look at the blocks takes it: a look holds one a moment)

    def refs(self, i: int) -> int:
        """Block ``i``'s reference count (always read through this one call, so that the
        interpreter's own references are the same each time)."""
        return sys.getrefcount(self.blocks[i])

    def take(self, size: int) -> np.ndarray | None:
        """A free block that serves ``size`` to ``2 * size`` bytes (the smallest), else a
        new one if it fits under the limit once free blocks are let go; None if not."""
        if self.held() > self.limit:  # (the limit was lowered: free blocks over it go first)
            self.trim(self.limit)
        sizes = [len(b) - ALIGN for b in self.blocks]
        free = [i for i, n in enumerate(sizes) if size <= n <= 2 * size and self.refs(i) == self.idle]
        if free:
            return self.blocks[min(free, key=sizes.__getitem__)]
        if not self.trim(self.limit - size):
            return None
        self.blocks.append(np.empty(size + ALIGN, np.uint8))
        return self.blocks[-1]

    def trim(self, room: int) -> bool:
        """Let free blocks go, oldest first, until at most ``room`` bytes are held; False
        if the blocks in use alone hold more."""
        i = 0
        while self.held() > room and i < len(self.blocks):
            if self.refs(i) == self.idle:
                del self.blocks[i]
            else:
                i += 1
        return self.held() <= room

    def held(self) -> int:
        """Bytes of blocks held now (free or in use)."""
        return sum(len(b) - ALIGN for b in self.blocks)


POOL = Pool(int(os.environ.get("SHMBUF_POOL_BYTES", 256 << 20)))


def _after_fork() -> None:
    POOL.lock = threading.Lock()  # (another thread may have held it at the fork)


os.register_at_fork(after_in_child=_after_fork)


def limit(nbytes: int | None = None) -> int:
    """The most bytes of batch memory a process keeps for reuse; with ``nbytes``, set it
    (0: every batch is a fresh ``np.empty``) and return the old limit. Free blocks over a
    lower limit go at once, the others as they come free.

    Examples:
        >>> import shmbuf
        >>> old = shmbuf.pool_limit(64 << 20)
        >>> shmbuf.pool_limit(old)
        67108864
    """
    if nbytes is None:
        return POOL.limit
    if isinstance(nbytes, bool) or not isinstance(nbytes, (int, np.integer)) or nbytes < 0:
        raise ValueError(f"the pool's limit must be an int >= 0 (bytes), got {nbytes!r}")
    with POOL.lock:
        old, POOL.limit = POOL.limit, int(nbytes)
        POOL.trim(POOL.limit)
    return old


def owns(arrays: Sequence[np.ndarray | None]) -> bool:
    """Whether any of ``arrays`` is a view of the pool's memory."""
    bases = {id(a.base) for a in arrays if a is not None and a.base is not None}
    with POOL.lock:
        return not bases.isdisjoint(map(id, POOL.blocks))


def batch(fields: Iterable[Any], m: int, **extra: Any) -> dict[str, np.ndarray]:
    """One batch from :func:`empty`: ``{f.name: (m, *f.shape)}`` for ``fields`` (anything
    with a ``name``, a ``shape`` and a ``dtype``), then ``{name: (m,)}`` of each ``extra``
    dtype.

    Examples:
        >>> from shmbuf.core.layout import Layout
        >>> fields = Layout.plan({"x": ((2,), "f4")}, 4, 1, 0, (1, 0.0), 0.0, None, {}).fields
        >>> {k: a.shape for k, a in batch(fields, 3, _p=float).items()}
        {'x': (3, 2), '_p': (3,)}
    """
    specs = {f.name: ((m,) + tuple(f.shape), f.dtype) for f in fields}
    specs.update({name: ((m,), dtype) for name, dtype in extra.items()})
    return dict(zip(specs, empty(list(specs.values()))))


def empty(specs: Sequence[Spec]) -> list[np.ndarray]:
    """Uninitialised arrays of the given ``(shape, dtype)``, one block's views (or fresh
    ``np.empty`` arrays for a small batch, or when the pool has no room)."""
    sizes = [math.prod(s) * np.dtype(d).itemsize for s, d in specs]
    if sum(sizes) < SMALL:  # (the common small batch: nothing more to work out)
        return [np.empty(s, d) for s, d in specs]
    at, total = [], 0
    for n in sizes:
        at.append(total)
        total += -(-n // ALIGN) * ALIGN
    with POOL.lock:
        block = POOL.take(total)
        if block is not None:
            at0 = -block.ctypes.data % ALIGN
            return [block[at0 + o:at0 + o + n].view(d).reshape(s) for o, n, (s, d) in zip(at, sizes, specs)]
    return [np.empty(s, d) for s, d in specs]
