"""What a handle tells about its buffer: name, schema, sizes, state. A part of
:class:`shmbuf.Buffer` (it uses the handle's engine only)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from shmbuf.core.engine import Engine
from shmbuf.priority.trees import FIELD
from shmbuf.queue.protocol import FIELD as QUEUED
from shmbuf.ragged.schema import FIELD as RECORD, GROUP
from shmbuf.core.layout import FLAG_PERSIST, USER


class Properties:
    """``Buffer``'s properties (see :class:`shmbuf.Buffer`)."""

    engine: Engine
    _native: Any
    parts: Any
    """The buffer's parts (:class:`shmbuf.parts.Parts`): ``parts.specs``, as recorded in
    the segment, and ``parts.keywords``, the :meth:`create` keywords that make them."""

    @property
    def timeout(self) -> float:
        """Default timeout, in seconds, of this handle's blocking calls."""
        return self.engine.timeout

    @timeout.setter
    def timeout(self, value: float) -> None:
        self.engine.timeout = value

    @property
    def native(self) -> bool:
        """True if this handle writes and samples through the C extension (see
        :mod:`shmbuf.core.native`); False on the pure-Python path. Same results either way."""
        return self._native is not None

    @property
    def unlinked(self) -> bool:
        """True once this buffer's name is gone (its creator closed it or exited, or
        someone called :meth:`unlink` or ``shmbuf rm``), or names another buffer now.

        The memory stays valid for this handle until it closes, but nobody new can
        attach: a worker that sees True can stop writing. One system call.

        Examples:
            >>> import numpy as np, shmbuf
            >>> buf = shmbuf.Buffer.create({"x": ((), "int64")}, 4)
            >>> buf.unlinked
            False
            >>> import numpy as np, shmbuf
            >>> buf.unlink(); buf.unlinked
            True
            >>> import numpy as np, shmbuf
            >>> buf.close()
        """
        return not self.engine.seg.is_linked()

    @property
    def name(self) -> str:
        """The name other processes attach with."""
        return self.engine.name

    @property
    def fields(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """``{name: (shape, dtype)}``, in schema order (the hidden ``_priority`` of a
        prioritized buffer, ``_queued`` of a queue, ``_record`` and ``_group`` of ragged
        rows left out), the ragged fields last (their shape starts with None or their length's name)."""
        return {**{f.name: (f.shape, f.dtype) for f in self.engine.fields if f.name not in (FIELD, QUEUED, RECORD, GROUP)},
                **self.engine.records.fields}

    @property
    def meta(self) -> dict[str, Any]:
        """The JSON object given to :meth:`create` as ``meta``, exactly (a copy; ``{}``
        if none). Yours: the library never reads it.

        Examples:
            >>> import shmbuf
            >>> buf = shmbuf.Buffer.create({"x": ((), "int64")}, 4, meta={"sampler": "newest", "run": 7})
            >>> buf.meta, type(buf.sampler).__name__
            ({'sampler': 'newest', 'run': 7}, 'Uniform')
            >>> buf.close()
        """
        return json.loads(json.dumps(self.engine.layout.meta[USER]))

    @property
    def versioned(self) -> bool:
        """True for a buffer created with ``versions=True`` (a policy version per row)."""
        return self.parts.keywords["versions"]

    @property
    def max_times_sampled(self) -> int | None:
        """How many samples may return a row (``create(max_times_sampled=k)``); None: no limit."""
        return self.parts.keywords["max_times_sampled"]

    @property
    def prioritized(self) -> bool:
        """True for a buffer created with ``priority=`` (sampled by priority)."""
        return self.parts.keywords["priority"] is not None

    @property
    def capacity(self) -> int:
        """Rows the buffer holds when full (all lanes)."""
        return self.engine.layout.capacity

    @property
    def lanes(self) -> int:
        return self.engine.layout.lanes

    @property
    def lane_capacity(self) -> int:
        return self.engine.layout.lane_capacity

    @property
    def nbytes(self) -> int:
        """Bytes of shared memory the buffer takes (rows, stamps, tables, schema)."""
        return self.engine.layout.total_size

    @property
    def persist(self) -> bool:
        """True if the buffer outlives its creator until :meth:`unlink`."""
        return bool(self.engine.layout.flags & FLAG_PERSIST)

    @property
    def is_full(self) -> bool:
        """True when ``len(self) == capacity``."""
        return len(self) == self.capacity

    def __len__(self) -> int:
        """Rows currently held: written, or reserved by a writer still writing them (in
        a queue: not yet taken)."""
        return self.engine.writes.size()

    @property
    def total_added(self) -> int:
        """Rows ever added (all lanes, since creation; :meth:`clear` does not reset it)."""
        return int(self.engine.heads().sum())

    def __repr__(self) -> str:
        if self.closed:
            return f"<shmbuf.Buffer {self.name!r} (closed)>"
        lanes = f", lanes={self.lanes}" if self.lanes > 1 else ""
        return (f"<shmbuf.Buffer {self.name!r} {len(self)}/{self.capacity} rows{lanes}, "
                f"fields={list(self.fields)}>")

    @property
    def closed(self) -> bool:
        return self.engine.closed
