"""Policy versions (``Buffer.create(..., versions=True)``): every row keeps the version of
the policy that made it, and samples can ask for recent ones.

A write's rows get the version given as ``version=`` to ``add`` / ``extend``, or that
of what the handle is bound to (:meth:`Versions.bind`): an actor's, the version of the
weights it last pulled (``shmbuf.Actors`` binds each actor's handle so), or a
:class:`shmbuf.Weights`' latest. A handle's versions never go backwards (a smaller
one is refused and changes nothing), so with one writer per lane a lane's versions
never decrease. Samples carry a ``"version"`` entry; ``sample(n, min_version=v)`` and
``sample(n, max_staleness=k)`` (``v`` = the newest version minus ``k``) draw uniformly
over the rows of version ``>= v`` (see :mod:`shmbuf.versions.recent`). The newest
version is the bound ``Weights``' latest, else ``version=`` given to ``sample``, else
the newest row's.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from shmbuf.core.batch import rows_of
from shmbuf.core.ring import rows_published
from shmbuf.versions.recent import FIELD, Recent, freshness_table, weights


def check_version(value: Any, what: str = "version") -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"{what} must be an int >= 0, got {value!r}")
    return int(value)


def floor(v: int, high: int, what: str) -> int:
    """``v``, if not below ``high`` (``what``: says whose version ``high`` is)."""
    if v < high:
        raise ValueError(f"versions never go backwards: {what} {high}, got {v}")
    return v


class NoVersions:
    """The versions of a buffer created without ``versions=True``: none."""

    def stamp(self, data: Any, version: Any, single: bool) -> Any:
        if version is not None:
            raise ValueError("version= is for a buffer created with versions=True")
        return data

    def bind(self, weights: Any) -> None:
        raise ValueError("bind() is for a buffer created with versions=True")

    def current(self, version: Any) -> None:
        if version is not None:
            raise ValueError("version= is for a buffer created with versions=True")

    def done(self) -> None:
        pass

    def bound(self, *args: Any) -> tuple[int, int]:
        raise ValueError("min_version=, max_staleness= and freshness= are for a buffer created with versions=True")

    sample = rows_since = newest_row = bound

    def describe(self, engine: Any, stats: dict[str, Any]) -> None:
        """Add what this part knows to ``stats()`` (nothing)."""


class Versions:
    """The versions part of a handle (see the module)."""

    def __init__(self) -> None:
        self.weights: Any = None
        self.high = 0  # the largest version this handle wrote
        self.pending = 0  # the version of the write stamped last (the floor once a row of it is written)
        self.mark: int | None = None  # rows_published() as it was stamped (None: settled)
        self.memo: dict[str, Any] = {}  # where each lane's rows of a recent enough version begin
        self.view: np.ndarray | None = None  # (raw())
        self.seen: tuple[Any, Any, int] = (None, None, -1)  # the window newest_row last saw, its answer, its slot

    def bind(self, source: Any) -> None:
        """Rows written without ``version=`` get ``source.version``: a
        :class:`shmbuf.Actor`'s (the weights it last pulled) or a :class:`shmbuf.Weights`'
        (the latest published); None unbinds."""
        if source is not None and not hasattr(source, "version"):
            raise TypeError(f"bind takes a shmbuf.Actor or shmbuf.Weights (or None), got {type(source).__name__}")
        self.weights = source

    def stamp(self, data: Any, version: Any, single: bool) -> dict[str, Any]:
        if not isinstance(data, Mapping):
            raise TypeError(f"expected a mapping of field names to values, got {type(data).__name__}")
        if FIELD in data:
            raise ValueError(f"{FIELD!r} is kept by shmbuf: pass version= (or bind a shmbuf.Weights)")
        self.done()  # (the last write's, if a Ctrl-C kept it from settling)
        v = self.pending = self.current(version)
        self.mark = rows_published()
        return {**data, FIELD: v if single else np.full(rows_of(data), v, np.int64)}

    def done(self) -> None:
        """The write stamped last returned or raised: its version is the handle's floor
        now if this thread published any row since it was stamped (all of it, or part of
        an ``add_each`` stopped halfway: an error, a Ctrl-C); a write that wrote nothing
        moves nothing."""
        if self.mark is not None:
            if rows_published() != self.mark and self.pending > self.high:
                self.high = self.pending
            self.mark = None

    def current(self, version: Any) -> int:
        """The version of a write given ``version=`` (None: the bound source's), checked:
        never below what this handle wrote before."""
        if version is None:
            if self.weights is None:
                raise ValueError("this buffer keeps each row's policy version: pass version= to add/extend, "
                                 "or bind the actor's shmbuf.Weights with buf.bind(weights)")
            version = self.weights.version
            if version is None:
                raise ValueError("the bound actor has pulled no weights yet: pull() first, or pass version=")
        return floor(check_version(version), self.high, "this handle wrote version")

    def describe(self, engine: Any, stats: dict[str, Any]) -> None:
        """Each lane's ``newest_version`` (its newest row's, raw; None for an empty lane),
        and ``sampled_staleness``: the rows that samples by version (and takes with a
        lag limit) returned, their mean and largest staleness (None: none yet)."""
        stats["sampled_staleness"] = engine.counters.staleness()
        lo, head = engine.window()
        view, lc = self.raw(engine), engine.layout.lane_capacity
        for i, d in enumerate(stats["lanes"]):
            d["newest_version"] = int(view[i * lc + (head[i] - 1) % lc]) if head[i] > lo[i] else None

    def sample(self, engine: Any, n: int, out: Any, timeout: Any, min_version: Any, max_staleness: Any,
               version: Any, freshness: Any) -> Any:
        """``Buffer.sample`` with these arguments (see :mod:`shmbuf.versions.recent`)."""
        window = engine.window()
        bound, newest = self.bound(engine, window, min_version, max_staleness, version, freshness is not None)
        table = freshness_table(freshness, max(newest - bound, 0))
        got = engine.read(Recent(engine, bound, self.memo, window, newest, table, self.raw(engine)), n, n, timeout, out)
        if table is not None:
            got["weight"] = weights(table, newest, got[FIELD])
        engine.counters.stale(newest, got[FIELD])
        return got

    def raw(self, engine: Any) -> np.ndarray:
        """The versions of every slot, raw (read-only; kept: one view a handle)."""
        if self.view is None:
            self.view = engine.view(FIELD)
        return self.view

    def bound(self, engine: Any, window: Any, min_version: Any, max_staleness: Any, version: Any,
              weighed: bool = False) -> tuple[int, int]:
        """The smallest version a sample with these arguments takes, and the newest
        version it counts staleness from (``window``: the lanes' ``(lo, head)``, read
        once for the whole sample; ``weighed``: a freshness weighting, which may come
        without a bound)."""
        if min_version is not None:
            if max_staleness is not None or version is not None:
                raise ValueError("pass min_version= alone, or max_staleness= (with version=, if no Weights is bound)")
            return check_version(min_version, "min_version"), self.newest(engine, window, None)
        if max_staleness is None and weighed:
            return 0, self.newest(engine, window, version)
        k = check_version(max_staleness, "max_staleness")
        newest = self.newest(engine, window, version)
        return max(newest - k, 0), newest

    def rows_since(self, engine: Any, bound: int) -> int:
        """Rows held of version ``>= bound`` (the lanes' binary search: exact where a
        lane's versions never decrease)."""
        lo, head = engine.window()
        return int((head - Recent(engine, check_version(bound, "min_version"), self.memo).starts(lo, head)).sum())

    def newest_row(self, engine: Any, window: Any = None) -> int | None:
        """The newest version of any lane's newest row (None: no rows; ``window``: the
        lanes' ``(lo, head)`` if read already)."""
        lo, head = engine.window() if window is None else window
        key, view = (lo.tolist(), head.tolist()), self.raw(engine)
        seen, newest, slot = self.seen
        if key != seen or (slot >= 0 and int(view[slot]) != newest):  # (written, cleared or restored since)
            lc = engine.layout.lane_capacity
            slots = [i * lc + (h - 1) % lc for i, (a, h) in enumerate(zip(*key)) if h > a]
            newest, slot = max(((int(view[j]), j) for j in slots), default=(None, -1))  # (Python ints: a few lanes)
            self.seen = key, newest, slot
        return newest

    def newest(self, engine: Any, window: Any, version: Any) -> int:
        """The version staleness counts from: ``version``, else the bound source's, else
        the newest row's."""
        if version is not None:
            newest = check_version(version)
        elif self.weights is not None and self.weights.version is not None:
            newest = int(self.weights.version)
        else:  # the newest row's (lanes' newest rows: versions never decrease in a lane)
            newest = self.newest_row(engine, window)
        return 0 if newest is None else newest


class Bound:
    """``bind``, ``rows_since``, ``newest_version`` and ``write_version`` of
    :class:`shmbuf.Buffer` (see the module)."""

    _versions: Any
    engine: Any

    def bind(self, source: Any) -> None:
        """Rows this handle writes without ``version=`` get ``source.version``: a
        :class:`shmbuf.Actor`'s, the version of the weights it last pulled (``Actors``
        binds each actor's handle so), or a :class:`shmbuf.Weights`' latest, from which
        ``max_staleness`` then counts; None unbinds. For a buffer created with
        ``versions=True``."""
        self._versions.bind(source)

    def rows_since(self, min_version: int) -> int:
        """How many rows held are of version ``>= min_version`` (what ``sample(n,
        min_version=...)`` draws from), for a buffer created with ``versions=True``."""
        return self._versions.rows_since(self.engine, min_version)

    @property
    def newest_version(self) -> int | None:
        """The version of the newest row of any lane (None: empty), for a buffer created
        with ``versions=True``."""
        return self._versions.newest_row(self.engine)

    def write_version(self, version: int | None = None) -> int | None:
        """The policy version a write given ``version=`` gets (None: the bound source's),
        checked as :meth:`add` checks it, for the layers that write rows of their own
        (an episode writer); None for a buffer without versions."""
        return self._versions.current(version)
