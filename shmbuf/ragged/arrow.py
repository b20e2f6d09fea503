"""Batches as Apache Arrow data, over the same memory: a :class:`~shmbuf.ragged.jagged.Jagged`
as a ``pyarrow.LargeListArray`` (int64 offsets, as a Jagged's) and back, a batch as a
``pyarrow.Table``.

pyarrow is an optional dependency (``pip install 'shmbuf[arrow]'``), imported here only
when a function is called (``import shmbuf`` never imports it).

**No copy** where the layouts agree: a Jagged's ``values`` (C-contiguous) become the list's
child array and its ``offsets`` the list's offsets buffer, both wrapped, not copied (the
Arrow array keeps the numpy arrays alive); trailing dimensions become
``FixedSizeListArray`` levels inside (a row of ``(L, 2)`` int16 is a list of
``fixed_size_list<int16, 2>``). The exceptions, which copy: bool values (Arrow packs
booleans in bits), values that are not C-contiguous, and, from Arrow, ``ListArray``
(int32 offsets), a sliced array (its offsets rebased to 0), a chunked array of more
than one chunk, bool values. Arrow rows that are null have no Jagged form: refused.

Examples:
    >>> import numpy as np, pyarrow as pa
    >>> from shmbuf import Jagged
    >>> j = Jagged.from_rows([[1, 2, 3], [], [4]], dtype=np.int32)
    >>> a = j.to_arrow()
    >>> a.type, a.to_pylist()
    (LargeListType(large_list<item: int32>), [[1, 2, 3], [], [4]])
    >>> Jagged.from_arrow(a).lengths
    array([3, 0, 1])
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np


def pyarrow() -> Any:
    """The ``pyarrow`` module; ``ImportError`` that says how to install it."""
    try:
        import pyarrow as pa
    except ImportError:
        raise ImportError("shmbuf's Arrow conversions need pyarrow, an optional dependency: "
                          "pip install 'shmbuf[arrow]'") from None
    return pa


def array(values: np.ndarray) -> Any:
    """``values`` (``(n, *trailing)``) as an Arrow array of ``n`` elements, each a
    ``FixedSizeList`` per trailing dimension around the values' type: over the same
    memory when they are C-contiguous and not bool (else a copy)."""
    pa = pyarrow()
    values = np.ascontiguousarray(values)  # (a copy only if it is not C-contiguous)
    flat = values.reshape(-1)
    if values.dtype == np.bool_:
        out = pa.array(flat)  # (Arrow's booleans are bits: a copy)
    else:
        try:
            kind = pa.from_numpy_dtype(values.dtype)
        except (pa.ArrowNotImplementedError, NotImplementedError, TypeError):
            raise ValueError(f"Arrow has no type for values of dtype {values.dtype}") from None
        out = pa.Array.from_buffers(kind, len(flat), [None, pa.py_buffer(flat)])
    for size in reversed(values.shape[1:]):
        out = pa.FixedSizeListArray.from_arrays(out, size)
    return out


def to_arrow(values: np.ndarray, offsets: np.ndarray) -> Any:
    """The rows of a Jagged's ``values`` and ``offsets`` (int64, from 0) as a
    ``pyarrow.LargeListArray`` (see the module: no copy of C-contiguous, non-bool
    values); :meth:`Jagged.to_arrow <shmbuf.ragged.jagged.Jagged.to_arrow>` calls it."""
    pa = pyarrow()
    child = array(values)
    offsets = np.ascontiguousarray(offsets)
    return pa.Array.from_buffers(pa.large_list(child.type), len(offsets) - 1, [None, pa.py_buffer(offsets)],
                                 children=[child])


def from_arrow(arr: Any) -> tuple[np.ndarray, np.ndarray]:
    """A ``pyarrow`` list array (``LargeListArray``, ``ListArray``, or a ``ChunkedArray``
    of either) as a Jagged's ``(values, offsets)`` (int64, from 0): over the same
    memory where it can be (see the module); its values are read-only then, as Arrow's
    memory is. Lists of fixed-size lists give trailing dimensions. ``ValueError`` for
    null rows or values, or a type that is not a list of numbers;
    :meth:`Jagged.from_arrow <shmbuf.ragged.jagged.Jagged.from_arrow>` calls it."""
    pa = pyarrow()
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)  # (more than one: a copy)
    if not isinstance(arr, (pa.LargeListArray, pa.ListArray)):
        raise ValueError(f"from_arrow takes a pyarrow ListArray or LargeListArray (one row a list), got "
                         f"{type(arr).__name__} of type {getattr(arr, 'type', '?')}")
    if arr.null_count:
        raise ValueError(f"the array holds {arr.null_count} null rows, which a Jagged cannot: fill them "
                         "(pyarrow.compute.fill_null) or drop them (pyarrow.compute.drop_null) first")
    offsets = arr.offsets.to_numpy(zero_copy_only=True)
    offsets = offsets if offsets.dtype == np.int64 else offsets.astype(np.int64)
    child, trailing = arr.values, []
    while isinstance(child, pa.FixedSizeListArray):
        if child.null_count:
            raise ValueError("the array's values hold nulls, which a Jagged cannot: fill them first")
        trailing.append(child.type.list_size)
        child = child.flatten()  # (its own offset applied: a slice, not a copy)
    if child.null_count:
        raise ValueError("the array's values hold nulls, which a Jagged cannot: fill them first")
    try:
        flat = child.to_numpy(zero_copy_only=not pa.types.is_boolean(child.type))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, NotImplementedError) as exc:
        raise ValueError(f"the rows' values are {child.type}, not numbers a numpy array holds ({exc})") from None
    values = flat.reshape((-1, *trailing))
    if offsets[0] != 0 or offsets[-1] != len(values):  # (a slice of a larger array: rebased, a copy of the offsets)
        values = values[offsets[0]:offsets[-1]]
        offsets = offsets - offsets[0]
    return values, offsets


def to_table(batch: Mapping[str, Any]) -> Any:
    """A batch (``sample``'s or ``take``'s: fixed fields as arrays of ``n`` rows, ragged
    fields as Jagged: anything with ``values`` and ``offsets``) as a ``pyarrow.Table`` of ``n`` rows, one column a field
    in the batch's order: a ragged field a ``large_list`` column (:func:`to_arrow`), a
    fixed field of shape ``(n, *shape)`` a column of its type (fixed-size lists for
    ``shape``). No copy where the layouts agree (see the module).

    Examples:
        >>> import numpy as np, shmbuf
        >>> from shmbuf.ragged.arrow import to_table
        >>> buf = shmbuf.Buffer.create({"t": ((None,), np.int32), "r": ((), np.float32)}, 8, arena=1 << 12)
        >>> buf.extend({"t": [np.arange(3), np.arange(1)], "r": [1.0, 2.0]})
        >>> table = to_table(buf.sample(5))
        >>> table.num_rows, table.schema.field("t").type, table.schema.field("r").type
        (5, LargeListType(large_list<item: int32>), DataType(float))
        >>> buf.close()
    """
    pa = pyarrow()
    columns, n = {}, None
    for name, value in batch.items():
        ragged = isinstance(getattr(value, "offsets", None), np.ndarray)  # (a Jagged: jagged.py imports us)
        column = to_arrow(value.values, value.offsets) if ragged else array(np.asarray(value))
        if n is not None and len(column) != n:
            raise ValueError(f"the batch's fields hold different numbers of rows: {name!r} {len(column)}, "
                             f"the ones before it {n}")
        n = len(column)
        columns[name] = column
    return pa.table(columns)
