"""The one read path: draw, checked gather, redraw the failures, one error.

Every way data leaves a segment (uniform rows and sequences, priorities, transitions
and n-step sums, trajectories, whole episodes, HER goals, a facade's paths) is a
*fill*: a function that draws candidates for some output positions, copies them with
the checked gather (:func:`shmbuf.core.sampling.copy_windows`: stamps before and after,
plus the sampler's own predicate such as "same episode" or "not a final row") and says
which positions it filled with data proven intact. :func:`until_filled` calls it until
every position is filled, and raises the one error when the deadline passes. The
guarantee therefore lives in two places only: the checked gather (what "intact" means)
and this loop (nothing unproven is ever returned, and nobody waits forever).

Example:
    >>> import numpy as np
    >>> out = np.zeros(4)
    >>> def fill(todo):  # fills the even positions first, the odd ones on the redraw
    ...     ok = (todo % 2 == 0) | (out[todo - 1] > 0)
    ...     out[todo[ok]] = 1.0
    ...     return ok
    >>> until_filled(fill, 4, 1.0, "rows")
    >>> out.tolist()
    [1.0, 1.0, 1.0, 1.0]
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np


class SampleTimeout(TimeoutError):
    """No published row could be copied in time."""


Fill = Callable[[np.ndarray], "np.ndarray | None"]


def until_filled(fill: Fill, n: int, timeout: float, what: str, *, deadline: float | None = None,
                 hint: str = "", check: Callable[[int], None] | None = None,
                 filled: np.ndarray | None = None) -> None:
    """Call ``fill(todo)`` (``todo``: the positions still to fill, ascending) until it
    has filled all ``n`` positions. ``fill`` returns a mask over ``todo`` of the ones it
    filled (None: all of them); the others are drawn again. ``check(rounds)``, before
    each redraw, raises the ``ValueError`` that says why nothing can be drawn, if that
    is so. At ``deadline`` (default: ``timeout`` seconds from now):
    :class:`SampleTimeout` naming how many ``what`` are missing, plus ``hint``.
    ``filled``: the mask of the positions a first draw, made by the caller, filled (a
    sampler's hot path draws and copies once before it needs this loop)."""
    if deadline is None:
        deadline = time.monotonic() + timeout
    todo = np.arange(n) if filled is None else np.flatnonzero(~filled)
    rounds = 0 if filled is None else 1
    while len(todo):
        if rounds and check is not None:
            check(rounds)
        if rounds and time.monotonic() >= deadline:
            raise SampleTimeout(f"could not copy {len(todo)} intact {what} within {timeout:g} s{hint}")
        ok = fill(todo)
        if ok is None:
            return
        todo = todo[~ok]
        rounds += 1
