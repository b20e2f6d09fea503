"""``Buffer``: the shared-memory replay buffer that users create, attach, write and sample."""

from __future__ import annotations

import json
import os
import secrets
import time
from typing import Any, Mapping

import numpy as np

from shmbuf import parts
from shmbuf.core import counters, durable, procs, storage, validate
from shmbuf.core.batch import Outputs, count
from shmbuf.core.deadline import Deadline
from shmbuf.core.engine import DEFAULT_TIMEOUT, Engine, open_segment
from shmbuf.core.plain import NoPriorities, NoRecords, Replay
from shmbuf.buffer.lanes import Lanes, LaneWriter  # noqa: F401  (shmbuf.buffer.handle.LaneWriter)
from shmbuf.buffer.properties import Properties
from shmbuf.buffer.sample import Reads
from shmbuf.queue import take as queue_part
from shmbuf.ragged import schema as ragged_schema
from shmbuf.versions import bound as versions_part
from shmbuf.buffer.snapshots import Snapshots
from shmbuf.core.layout import CONTROL_WORDS, CTRL_NO_YIELD, FLAG_PERSIST, USER, Layout, check_meta
from shmbuf.rate.limit import RateLimit
from shmbuf.samplers.uniform import Uniform
from shmbuf.core.segment import Segment


Batch = dict[str, np.ndarray]


class Buffer(Properties, Lanes, Snapshots, Reads, queue_part.Queues, versions_part.Bound):
    """A FIFO replay buffer in one shared-memory segment, shared by name.

    Many processes may :meth:`add`/:meth:`extend` at once (writers run in parallel;
    the lock covers only slot reservation) while others :meth:`sample`. A sample never
    returns a row that is half written, reserved but unwritten, or overwritten while
    it was copied. A process killed at any point never blocks the others.

    Examples:
        >>> import numpy as np, shmbuf
        >>> fields = {"obs": ((3,), np.float32), "reward": ((), np.float32)}
        >>> with shmbuf.Buffer(fields, capacity=100, seed=0) as buf:
        ...     buf.add({"obs": [1, 2, 3], "reward": 1.0})
        ...     buf.extend({"obs": np.zeros((4, 3)), "reward": np.ones(4)})
        ...     batch = buf.sample(8)
        ...     len(buf), batch["obs"].shape
        (5, (8, 3))

    ``Buffer(fields, capacity, ...)`` is :meth:`create`; attach to an existing buffer
    with :meth:`attach`, or make one from arrays with :meth:`from_data`.
    """

    # -- construction ----------------------------------------------------------------

    def __new__(cls, fields: Mapping[str, Any], capacity: int, **create_kwargs: Any) -> "Buffer":
        """``Buffer(fields, capacity, ...)`` is :meth:`create` (the call cpprb and
        stable-baselines3 users type)."""
        return cls.create(fields, capacity, **create_kwargs)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass  # __new__ (create or _open) did everything

    @classmethod
    def _open(cls, seg: Segment, layout: Layout, *, owner: bool, rng: np.random.Generator,
              timeout: float, counted: bool = True, deadline: Any = None) -> "Buffer":
        """A handle on a mapped, validated segment (see :class:`~shmbuf.core.engine.Engine`)."""
        self = object.__new__(cls)
        self.parts = described = parts.Parts(layout.meta)
        self.engine = engine = Engine(seg, layout, owner=owner, rng=rng, timeout=timeout, counted=counted,
                                      deadline=deadline, parts=described.open)
        self._native = engine.native  # None: pure Python, or closed
        # The hot paths, chosen once: the C ring for whole writes when no part adds to
        # a row (no queue, no priorities, no rate gate); the C ring for rows the parts
        # have stamped when no part waits (no queue, no rate gate); a plain uniform sample.
        self._versions = described.roles.get("versions") or versions_part.NoVersions()
        # (ragged rows: the Python path's writes, whose records the ring places)
        direct = isinstance(engine.writes, Replay) and not engine.gate.limited and isinstance(engine.records, NoRecords)
        self._plain = engine.native if direct and not engine.writes.adds and isinstance(engine.priorities, NoPriorities) \
            and isinstance(self._versions, versions_part.NoVersions) else None
        self._stamped = engine.native if direct and self._plain is None else None
        self._outputs = Outputs(layout.fields)
        self.sampler = (described.roles.get("sampler") or Uniform)(engine, self._outputs)
        self._uniform = direct and type(self.sampler) is Uniform  # (sample() inlines it; not a subclass's)
        return self

    @classmethod
    def create(cls, fields: Mapping[str, Any], capacity: int, *, name: str | None = None,
               lanes: int = 1, seed: Any = None, persist: bool = False,
               timeout: float = DEFAULT_TIMEOUT, meta: Mapping[str, Any] | None = None,
               rate: RateLimit | None = None, priority: float | None = None,
               mode: str = "replay", path: str | None = None, sampler: Any = "uniform",
               versions: bool = False, max_times_sampled: int | None = None, arena: int | None = None,
               writers_yield: bool = True, _library: Mapping[str, Any] | None = None, _regions: Mapping[str, int] | None = None,
               _parts: Mapping[str, Any] | None = None) -> "Buffer":
        """Create a buffer of ``capacity`` rows in a new shared-memory segment (or file).

        Args:
            fields: ``{name: (shape, dtype)}``; shape a tuple or int, ``()`` for scalars.
            capacity: rows in total (split evenly into ``lanes``).
            name: the name others attach with; a random one if None.
            lanes: independent rings, e.g. one per writer, for ordered sequences.
            seed: seed of this handle's ``numpy.random.Generator``.
            persist: if False (default) this process destroys the buffer on
                :meth:`close`, on exit, and (via the resource tracker) if it crashes. If
                True the buffer outlives it until someone calls :meth:`unlink`.
            timeout: default timeout of this handle's blocking calls, in seconds.
            writers_yield: if True (default), a writer waits before each write while a
                learner copies a batch of 1 MiB or more (once a write, at most 20 ms), so
                writers that write as fast as they can never starve a learner; False:
                writers never wait for samples. See :mod:`shmbuf.core.yielding`.
            meta: a JSON object of yours, kept with the schema and returned exactly as
                given by :attr:`meta` on every handle. The library never reads it: its
                own settings live apart (a key such as ``"sampler"`` changes nothing).
            rate: a :class:`~shmbuf.RateLimit` that every handle's samples and inserts
                then keep to (samples per insert, across all processes).
            priority: the exponent ``a`` of prioritized replay (0.6 is usual): samples are
                then drawn with probability ``p**a / sum p**a`` and carry ``weight`` and
                ``index``; see :meth:`update_priorities` and :mod:`shmbuf.priority.trees`.
            mode: ``"replay"`` (default) or ``"queue"``: rows consumed in order by
                :meth:`take`, each delivered once; writes wait while it is full
                instead of overwriting (see :mod:`shmbuf.queue.protocol`).
            path: keep the buffer in this file on a local disk instead of ``/dev/shm``
                (the same as a ``name`` with a ``/``): it may be larger than memory,
                it is persistent (``close`` never removes it), and :meth:`flush` makes
                it survive a restart of the machine (see :mod:`shmbuf.core.durable`).
                Others attach with ``Buffer.attach(path)``.
            sampler: which rows a sample holds, for every handle: ``"uniform"`` (the
                default), ``"newest"`` or ``"oldest"`` first, or another module of
                :mod:`shmbuf.samplers`; with options, ``(name, {options})`` (e.g.
                ``("recency", {"tau": 10_000})``); or a sampler class of yours, or
                ``"package.module:Class"``, recorded by its import path (see
                :mod:`shmbuf.samplers.part`). A prioritized buffer or a queue has its own.
            versions: keep each row's policy version (a ``"version"`` entry in samples;
                ``add``/``extend`` take ``version=``; ``sample`` takes ``min_version=`` and
                ``max_staleness=``): see :mod:`shmbuf.versions.bound`.
            max_times_sampled: return each row from at most this many samples, across all
                processes, then never again (a ``"times_sampled"`` entry in samples): see
                :mod:`shmbuf.limited.sampler`.
            arena: bytes for the values of ragged fields (a field shaped ``(None, ...)``,
                or ``("R", ...)`` for a length ``"R"`` several fields share), every lane's
                together: each lane keeps its rows' values in a ring of ``arena / lanes``
                bytes, and its oldest rows leave as it wraps (a queue's writes wait for
                room instead). Size it as rows times their mean bytes. See
                :mod:`shmbuf.ragged` and ``docs/guides/ragged.md``.

        Raises:
            FileExistsError: the name (or path) is taken.
            ShmSpaceError: ``/dev/shm`` (or the disk) cannot hold it (nothing is allocated).
            OSError: ``path`` is on a network or FUSE file system (refused).
            ValueError, TypeError: a bad schema, capacity, lanes, seed, timeout or persist.

        Examples:
            >>> buf = Buffer.create({"x": ((), "int64")}, 10, name="doc-create")
            >>> buf.capacity, buf.name
            (10, 'doc-create')
            >>> buf.close()
        """
        # _library: what the layers built on Buffer (EpisodeBuffer, the compat facades, a
        # loaded save) describe themselves with, kept beside the parts' specs ("parts") in
        # the layout's meta and read back from engine.layout.meta; the user's meta= goes
        # under its own key, USER (see shmbuf.core.layout); _regions: {name: bytes} of the
        # blocks they keep in the segment (engine.layout.regions); _parts: the specs of the
        # parts (shmbuf.parts) in place of the keywords that make them (a load's). Not for users.
        user = json.loads(json.dumps(check_meta(meta)))  # (a copy: stored as given, never read)
        meta = dict(_library or {})
        if path is not None and name is not None:
            raise ValueError(f"pass name= or path=, not both (got name={name!r}, path={path!r})")
        name = path if path is not None else f"{os.getpid()}-{secrets.token_hex(4)}" if name is None else name
        store = storage.of(name, path is not None)
        name = store.check_name(name)
        persist = validate.flag(persist, "persist") or store.durable
        timeout = validate.timeout(timeout)
        rng = validate.rng(seed)
        yield_ = validate.flag(writers_yield, "writers_yield")
        fields, ragged = ragged_schema.split(fields)
        if (ragged is None) != (arena is None) and _parts is None:
            raise ValueError("arena= is for a buffer with ragged fields (shaped (None, ...) or ('R', ...)); "
                             "leave it out" if ragged is None else
                             f"ragged fields {[r['name'] for r in ragged['fields']]} need arena=: the bytes "
                             "their values take in all (rows kept x their mean bytes, say)")
        specs = parts.check(_parts) if _parts is not None else parts.specs(
            {"mode": mode, "priority": priority, "versions": versions, "max_times_sampled": max_times_sampled,
             "rate": rate, "sampler": sampler, "arena": None if ragged is None else {**ragged, "arena": arena}})
        regions = {counters.REGION: counters.region_bytes(count(lanes, "lanes", 1))}
        if store.durable:  # (where a restart may cut writes: shmbuf.core.durable)
            regions[durable.REGION] = durable.region_bytes(lanes)
        planned = parts.plan(specs, parts.Plan(fields, capacity, lanes, regions, store.durable))
        fields, regions = planned.fields, planned.regions
        if "parts" in meta or USER in meta:
            raise ValueError(f"_library holds the keys 'parts' or {USER!r}, which are not a library's")
        meta["parts"] = specs
        for key, size in (_regions or {}).items():
            if key in regions:
                raise ValueError(f"region {key!r} is a capability's own")
            regions[key] = size
        layout = Layout.plan(fields, capacity, lanes, FLAG_PERSIST if persist else 0,
                             procs.identity(), time.time(), {**meta, USER: user}, regions)
        seg = store.create(name, layout.total_size)
        try:
            layout.write(seg.mmap)  # a new segment reads as zeros: empty tables and stamps
            if not yield_:
                np.ndarray((CONTROL_WORDS,), np.int64, seg.mmap, layout.control_offset)[CTRL_NO_YIELD] = 1
            buf = cls._open(seg, layout, owner=not persist, rng=rng, timeout=timeout)
            seg.publish()  # (a file gets its path only now, complete)
        except BaseException:
            seg.unlink()
            seg.close()
            raise
        if persist:
            seg.untrack()  # complete: from now on it outlives us
        return buf

    @classmethod
    def attach(cls, name: str, *, seed: Any = None, timeout: float = DEFAULT_TIMEOUT) -> "Buffer":
        """Attach to an existing buffer by name (a name with ``/`` is the path of a
        buffer file); its schema is read from the segment.

        Waits up to ``timeout`` seconds in all: for a buffer that is still being created,
        then for its lock. The attaching process never destroys the buffer when it exits.

        Raises:
            FileNotFoundError: no buffer has this name.
            FormatError: the segment is not a (complete, compatible, intact) shmbuf
                buffer; everything read from it is checked.

        Examples:
            >>> owner = Buffer.create({"x": ((), "int64")}, 10, name="doc-attach")
            >>> Buffer.attach("doc-attach").fields
            {'x': ((), dtype('int64'))}
            >>> owner.close()
        """
        return cls._open_by_name(name, seed, timeout, True)

    @classmethod
    def observe(cls, name: str, *, timeout: float = 0.5) -> "Buffer":
        """Attach as an observer (``shmbuf ls``, ``stat``, ``watch``): a handle that takes
        no stats slot and no lock, for reading facts and counters without changing them.

        Examples:
            >>> owner = Buffer.create({"x": ((), "int64")}, 10, name="doc-observe")
            >>> Buffer.observe("doc-observe").capacity
            10
            >>> owner.close()
        """
        return cls._open_by_name(name, None, timeout, False)

    @classmethod
    def _open_by_name(cls, name: str, seed: Any, timeout: float, counted: bool) -> "Buffer":
        """:meth:`attach` (``counted``) or :meth:`observe`."""
        name, timeout, rng = storage.check(name), validate.timeout(timeout), validate.rng(seed)
        deadline = Deadline(timeout)  # (the wait for the segment, then the engine's: one timeout)
        seg, layout = open_segment(name, timeout)
        try:
            return cls._open(seg, layout, owner=False, rng=rng, timeout=timeout, counted=counted, deadline=deadline)
        except BaseException:
            seg.close()
            raise

    @classmethod
    def from_data(cls, data: Mapping[str, Any], capacity: int | None = None,
                  truncate_ok: bool = False, **create_kwargs: Any) -> "Buffer":
        """Create a buffer whose schema and first rows come from ``data``.

        Follows imitation's ``Buffer.from_data`` code (not its docstring): capacity
        defaults to the number of rows, so the buffer starts full; more rows than
        ``capacity`` raise ``ValueError`` unless ``truncate_ok=True``, which keeps the
        last ``capacity`` rows. Arrays are copied; dtypes are kept. The buffer has one
        lane (``lanes=`` is refused: create a multi-lane buffer and ``extend`` each lane).

        Examples:
            >>> buf = Buffer.from_data({"x": np.arange(4)})
            >>> len(buf), buf.is_full
            (4, True)
            >>> buf.close()
        """
        truncate_ok = validate.flag(truncate_ok, "truncate_ok")
        if create_kwargs.get("lanes", 1) != 1:
            raise ValueError(f"from_data makes a one-lane buffer, got lanes={create_kwargs['lanes']!r}; "
                             "use Buffer.create(..., lanes=k) and extend(..., lane=i) per lane")
        if not isinstance(data, Mapping) or len(data) == 0:
            raise ValueError("from_data needs a non-empty mapping of name -> array, got no keys")
        if any(isinstance(v, (list, tuple)) and len({np.shape(r) for r in v}) > 1 for v in data.values()):
            raise ValueError("from_data makes fixed fields (one array per field, rows along axis 0), and a field "
                             "given as rows of different shapes would be ragged: create the buffer with "
                             "Buffer.create({name: ((None,), dtype)}, capacity, arena=...) and extend() it")
        arrays = {k: np.asarray(v) for k, v in data.items()}
        for k, a in arrays.items():
            if a.ndim == 0:
                raise ValueError(f"field {k!r}: expected an array with rows along axis 0, got a scalar")
        lengths = {k: len(a) for k, a in arrays.items()}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"all fields must have the same number of rows, got {lengths}")
        n = next(iter(lengths.values()))
        if n == 0:
            raise ValueError("from_data needs at least one row, got 0")
        if capacity is None:
            capacity = n
        capacity = count(capacity, "capacity", 1)
        if n > capacity and not truncate_ok:
            raise ValueError(f"{n} rows do not fit in capacity {capacity}; pass truncate_ok=True "
                             f"to keep the last {capacity}")
        buf = cls.create({k: (a.shape[1:], a.dtype) for k, a in arrays.items()}, capacity,
                         **create_kwargs)
        try:
            buf.extend(arrays, truncate_ok=truncate_ok, lane=0)
        except BaseException:
            buf.unlink()
            buf.close()
            raise
        return buf

    # -- writing ---------------------------------------------------------------------

    def add(self, transition: Mapping[str, Any], *, lane: int | None = None,
            timeout: float | None = None, priority: float | None = None, version: int | None = None) -> None:
        """Add one transition: ``{name: value}`` with each value of the field's shape.
        ``priority``: a prioritized buffer's priority for it (default: the largest
        priority ever set). ``version``: the policy version that made it, in a buffer
        created with ``versions=True`` (default: the bound ``Weights``' version; see
        :mod:`shmbuf.versions.bound`).

        Examples:
            >>> buf = Buffer.create({"obs": ((2,), "float32"), "done": ((), bool)}, 4)
            >>> buf.add({"obs": [0.5, 1.5], "done": False}); len(buf)
            1
            >>> buf.close()
        """
        plain = self._plain
        if plain is not None and priority is None and version is None and plain.add(transition, lane, timeout) is None:
            return  # the common case, checked and written in C
        engine = self.engine
        transition = self._versions.stamp(transition, version, True)
        stamped = self._stamped
        try:
            transition = engine.records.stamp(transition, True)
            transition = engine.priorities.stamp(engine.writes.stamp(transition, True), priority, None)
            if stamped is None or stamped.add(transition, lane, timeout) is not None:
                arrays, n = engine.schema.check_rows(transition, single=True)
                engine.write(arrays, n, lane, timeout)
        finally:
            engine.records.done()
            self._versions.done()  # (its version is the floor once its row is written)

    def extend(self, batch: Mapping[str, Any], *, lane: int | None = None,
               truncate_ok: bool = False, timeout: float | None = None,
               priority: Any = None, version: int | None = None) -> None:
        """Add ``n`` transitions given along axis 0 of every field (``priority``: of a
        prioritized buffer, one for all or one per row; ``version``: as :meth:`add`'s).

        More rows than a lane holds raise ``ValueError`` unless ``truncate_ok=True``,
        which keeps only the last ``lane_capacity`` of them. Values are checked before
        anything is written: on any error the buffer is unchanged.

        Examples:
            >>> buf = Buffer.create({"x": ((), "int64")}, 3, seed=0)
            >>> buf.extend({"x": np.arange(5)}, truncate_ok=True)
            >>> sorted(buf.sample(50)["x"].tolist())[0]
            2
            >>> buf.close()
        """
        plain = self._plain
        if plain is not None and priority is None and version is None and truncate_ok is False \
                and plain.extend(batch, lane, timeout) is None:
            return  # the common case, checked and written in C
        engine = self.engine
        if truncate_ok is not False:
            engine.writes.check_truncate()
        batch = self._versions.stamp(batch, version, False)
        stamped = self._stamped
        try:
            batch = engine.records.stamp(batch, False)
            batch = engine.priorities.stamp(engine.writes.stamp(batch, False), priority, 0)
            if stamped is not None and truncate_ok is False and stamped.extend(batch, lane, timeout) is None:
                return
            arrays, n = engine.schema.check_rows(batch, single=False)
            if truncate_ok is not False:
                truncate_ok = validate.flag(truncate_ok, "truncate_ok")
            cap = engine.layout.lane_capacity
            if n > cap:
                if not truncate_ok:
                    per = " per lane" if self.lanes > 1 else ""
                    raise ValueError(
                        f"{n} rows do not fit in the buffer ({cap} rows{per}); pass "
                        f"truncate_ok=True to keep only the last {cap}")
                arrays = [a[n - cap:] for a in arrays]
                n = cap
            if n == 1:
                arrays = [a[0] for a in arrays]  # one row is written without its row axis
            engine.write(arrays, n, lane, timeout)
        finally:
            engine.records.done()
            self._versions.done()

    # -- sampling --------------------------------------------------------------------

    # -- lifetime --------------------------------------------------------------------

    def close(self) -> None:
        """Detach. The creator's close also destroys the buffer unless ``persist=True``
        (arrays returned by :meth:`sample` are copies and stay valid)."""
        self._native = self._plain = None  # calls go to the engine's ring, which says it is closed
        self.engine.close()

    def unlink(self) -> None:
        """Destroy the buffer's name now, from any handle (a second call is harmless):
        processes that have it attached keep working on it until they close; nobody can
        attach any more."""
        self.engine.seg.unlink()

    def __enter__(self) -> "Buffer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickles as its name: unpickling attaches (in any process, any start method)."""
        return (_attach, (self.name, self.engine.timeout))


def _attach(name: str, timeout: float) -> Buffer:
    return Buffer.attach(name, timeout=timeout)
