"""Which path runs the hot loops: the C extension ``shmbuf._native``, or pure Python.

The extension is built by ``pip install`` where a C compiler is present (``setup.py``
marks it optional: without a compiler the install still succeeds). Both paths speak
the same protocol on the same segments, so processes on either path share a buffer.
Set ``SHMBUF_PURE_PYTHON=1`` to use the pure-Python path in a process that has the
extension (``0``, or unset: the native path; read when a handle is created or
attached; any other value is refused).

Examples:
    >>> import shmbuf.core.native
    >>> shmbuf.core.native.path() in ("native", "python")
    True
"""

from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np

from shmbuf.core import procs
from shmbuf.core.layout import Layout
from shmbuf.core.segment import FormatError

try:
    from shmbuf.core import _native  # type: ignore[attr-defined]
except ImportError:  # not built: no compiler at install time
    _native = None


def _probe_arrays() -> bool:
    """Let the extension read numpy arrays from their objects (csrc/arrays.c) if two
    arrays whose every property is known here read as expected there."""
    a = np.empty((2, 3), np.int32)
    return bool(_native.probe_arrays(a, a[:, ::2], a.ctypes.data, a.dtype))


ARRAYS_READ_DIRECTLY = _native is not None and _probe_arrays()
"""Whether the native path reads incoming arrays from their objects (else through
their buffers: the same result, ~60 ns a field slower)."""


def extension() -> Any:
    """The C extension module (its functions: the priority trees'), or None."""
    return _native


def published() -> int:
    """Rows this thread has published on the native path (0 without the extension)."""
    return 0 if _native is None else _native.published()


def available() -> bool:
    """True if the extension was built and imports."""
    return _native is not None


ENV = "SHMBUF_PURE_PYTHON"


def path() -> str:
    """``"native"`` or ``"python"``: the path a handle created now uses
    (``shmbuf.implementation()``).

    ``SHMBUF_PURE_PYTHON``: ``1`` selects the pure-Python path; ``0``, empty or unset the
    native one where the extension is built. Any other value is a ``ValueError``."""
    pure = os.environ.get(ENV, "")
    if pure not in ("", "0", "1"):
        raise ValueError(f"{ENV}={pure!r}: expected 1 (the pure-Python path) or 0 (the native path, "
                         "where the extension is built), or leave it unset")
    return "native" if _native is not None and pure != "1" else "python"


def _format(dtype: np.dtype) -> str | None:
    """The buffer-protocol format of an array of ``dtype`` (None where numpy gives none)."""
    try:
        return memoryview(np.empty(1, dtype)).format
    except (ValueError, TypeError):
        return None


def _scalar_kind(f: Any) -> str:
    """Which plain Python numbers the C fast path may convert itself for a 0-d field."""
    d = f.dtype
    if f.shape or not d.isnative:
        return "\0"
    if d == np.float32:
        return "f"
    if d == np.float64:
        return "d"
    if d == np.bool_:
        return "?"
    if d.kind in "iu" and d.itemsize in (1, 2, 4, 8) and np.little_endian:
        return d.kind
    return "\0"


class PurePythonWarning(RuntimeWarning):
    """The C extension is not built: shmbuf runs its pure-Python path (about 3x slower)."""


_warned = False


def make_ring(layout: Layout, mem: Any, busy: np.ndarray, prefaulted: bytearray,
              is_alive: Any, write_timeout: type, lock_timeout: Any) -> Any:
    """The C ring over ``mem`` (a mapped, validated ``layout``), or None on the Python
    path (the first handle of a process without the extension warns, once, unless
    ``SHMBUF_PURE_PYTHON=1`` asked for that path)."""
    if path() != "native":
        global _warned
        if _native is None and os.environ.get(ENV) != "1" and not _warned:
            _warned = True
            import warnings
            warnings.warn(PurePythonWarning(
                "shmbuf's C extension is not built (no C compiler at install time, or its build failed): "
                "it runs its pure-Python path, about 3x slower. Install a C compiler (gcc) and reinstall "
                f"shmbuf; `shmbuf doctor` says more. Set {ENV}=1 to choose that path and silence this."),
                stacklevel=2)
        return None
    # (names interned: a dict's key written in the source is the same object, which a
    # lookup then matches by identity, without comparing the strings)
    fields = [(sys.intern(f.name), np.dtype(f.dtype).type, f.offset, f.stride, f.row_bytes, f.dtype.itemsize,
               tuple(f.shape), _format(f.dtype), _scalar_kind(f), np.dtype(f.dtype)) for f in layout.fields]
    geometry = (layout.lanes_offset, layout.reservations_offset, layout.n_reservations,
                layout.control_offset, layout.rows_offset, layout.row_stride, layout.lanes,
                layout.lane_capacity)
    return _native.Ring(mem, geometry, fields, busy, prefaulted, np.ndarray, is_alive,
                        write_timeout, lock_timeout, FormatError)


def configure(ring: Any, fd: int, lane: int | None, timeout: float, slot_offset: int = -1,
              lane_stats_offset: int = -1, horizon_offset: int = -1) -> None:
    """Tell the C ring who this process is, the handle's defaults and where its counters
    and a buffer file's horizon are (byte offsets in the segment, -1: none; see
    :mod:`shmbuf.core.report` and :mod:`shmbuf.core.durable`)."""
    pid, ctime = procs.identity()
    ring.configure(pid, ctime, fd, -1 if lane is None else lane, timeout, slot_offset, lane_stats_offset,
                   horizon_offset)
