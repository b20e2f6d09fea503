"""The one read path: draw, checked gather, redraw the failures, one error.

Every way data leaves a segment (uniform rows and windows, the newest rows, priorities,
transitions and n-step sums, trajectories, whole episodes, HER goals, a queue's take, a
facade's own draws) is a :class:`Sampler`: it *draws* candidates and *gathers* them
with the checked gather (:func:`shmbuf.core.gather.copy_windows`: stamps before and
after, plus the sampler's own predicate such as "same episode" or "not a final row"),
saying which candidates it copied intact. :func:`read` drives any sampler: it keeps
each position's intact candidate, gives the failed positions the intact spares, draws
again for the rest, and raises the one :class:`SampleTimeout` when the deadline
passes. The guarantee therefore lives in two places only: the checked gather (what
"intact" means) and this loop (nothing unproven is ever returned, and nobody waits
forever).

A batch is a dict (or a list) of arrays whose first axis is the position (None in a
list: a field not wanted); a sampler's ``empty(m)`` makes one for ``m`` candidates.

Examples:
    >>> import numpy as np
    >>> class Evens(Sampler):  # candidates 0, 1, 2, ...: only the even ones come out intact
    ...     what = "numbers"
    ...     def __init__(self):
    ...         self.next = 0
    ...     def empty(self, m):
    ...         return {"x": np.zeros(m, np.int64)}
    ...     def draw(self, todo, rounds, deadline):
    ...         got = np.arange(self.next, self.next + len(todo))
    ...         self.next += len(todo)
    ...         return got
    ...     def gather(self, drawn, out):
    ...         out["x"][:] = drawn
    ...         return drawn % 2 == 0
    >>> read(Evens(), 4, 1.0)["x"].tolist()
    [0, 4, 2, 6]
"""

from __future__ import annotations

import time
from typing import Any, Callable, Union

import numpy as np


HOOK: Callable[[int], None] | None = None
"""Test hook, called as ``HOOK(round)`` before each round of :func:`read` after the first
(the copies a round found torn or unpublished are drawn again). Never set outside tests."""


class SampleTimeout(TimeoutError):
    """No published row could be copied in time."""


Batch = Union[dict, list]


class Sampler:
    """A way to read a batch out of a segment, driven by :func:`read`.

    Subclasses define :meth:`empty`, :meth:`draw` and :meth:`gather`; ``what`` (plural:
    "rows", "transitions", ...) and ``hint`` go into the timeout's message. A sampler may
    keep state of its own between calls (its plans, what it last saw rejected) and for
    the length of one call (reset it before calling :func:`read`).
    """

    what = "rows"
    hint = ""

    def empty(self, m: int) -> Batch:
        """A batch for ``m`` candidates."""
        raise NotImplementedError

    def draw(self, todo: np.ndarray, rounds: int, deadline: float) -> Any:
        """Candidates for the positions ``todo`` (ascending), plus :meth:`spare` more, in
        round ``rounds`` (0: the first). ``ValueError`` if none can be drawn."""
        raise NotImplementedError

    def gather(self, drawn: Any, out: Batch) -> np.ndarray | None:
        """Copy the candidates ``drawn`` into ``out`` with the checked gather; the mask of
        those copied intact (None: all of them)."""
        raise NotImplementedError

    def spare(self, m: int, rounds: int) -> int:
        """How many candidates beyond ``m`` to draw in round ``rounds`` (0: none)."""
        return 0

    def check(self, rounds: int) -> None:
        """Before round ``rounds`` (>= 1): raise the ``ValueError`` that says why nothing
        can be drawn, if that is so."""

    def scatter(self, got: Batch, src: np.ndarray, out: Batch, dst: np.ndarray) -> None:
        """``out[dst] = got[src]``, position by position, for every array of the batches
        (same structure; a sampler whose arrays hold several rows a position says how)."""
        for a, b in zip(arrays(got), arrays(out)):
            b[dst] = a[src]


def arrays(batch: Batch) -> list[np.ndarray]:
    """The arrays of a batch (a list's Nones left out)."""
    return [a for a in (batch.values() if isinstance(batch, dict) else batch) if a is not None]


def read(sampler: Sampler, n: int, timeout: float, out: Batch | None = None, *,
         deadline: float | None = None, todo: np.ndarray | None = None) -> Batch:
    """``n`` intact items from ``sampler`` into ``out`` (default: ``sampler.empty(n)``),
    which is returned. A position keeps its candidate if it was copied intact; failed
    positions take the intact spares in order; the rest are drawn again. At ``deadline``
    (default: ``timeout`` seconds from now): :class:`SampleTimeout`. ``todo``: the
    positions of ``out`` that a first round, made by the caller, left to fill (a hot
    path draws and gathers once itself before it needs this loop)."""
    if deadline is None:
        deadline = time.monotonic() + timeout
    rounds = 0 if todo is None else 1
    if todo is None:
        todo = np.arange(n)
    while len(todo):
        if rounds:
            if HOOK is not None:
                HOOK(rounds)
            sampler.check(rounds)
            if time.monotonic() >= deadline:
                raise SampleTimeout(f"could not copy {len(todo)} intact {sampler.what} within "
                                    f"{timeout:g} s{sampler.hint}")
        m = len(todo)
        extra = sampler.spare(m, rounds)
        here = rounds == 0 and (out is None or extra == 0)  # candidate i is copied straight to position i
        if out is None:  # (the batch is the first n of the first round's candidates)
            got = sampler.empty(n + extra)
            out = got if not extra else \
                {k: a[:n] for k, a in got.items()} if isinstance(got, dict) else [a[:n] for a in got]
        else:
            got = out if here else sampler.empty(m + extra)
        ok = sampler.gather(sampler.draw(todo, rounds, deadline), got)
        rounds += 1
        if ok is None:
            if not here:
                sampler.scatter(got, np.arange(m), out, todo)
            return out
        mine = ok[:m].copy()
        bad = np.flatnonzero(~mine)
        spares = np.flatnonzero(ok[m:])[:len(bad)] + m
        took = bad[:len(spares)]
        if here:
            if len(spares):
                sampler.scatter(got, spares, out, todo[took])
            mine[took] = True
        else:
            mine[took] = True
            src = np.flatnonzero(mine)
            src[np.isin(src, took)] = spares  # (took is ascending: the spares in order)
            sampler.scatter(got, src, out, todo[mine])
        todo = todo[~mine]
    return sampler.empty(0) if out is None else out

