"""One ragged field of a batch: its rows' values end to end, and where each row starts.

A :class:`Jagged` has the layout of torch's jagged nested tensors and of flash-attention's
varlen kernels: ``values`` of shape ``(total, *trailing)`` holds row ``i`` at
``values[offsets[i]:offsets[i + 1]]``, and ``offsets`` (int64, ``(n + 1,)``) starts at 0
and ends at ``total``.
"""

from __future__ import annotations

import functools
import math
import operator
import warnings
from typing import Any, Iterable, Sequence

import numpy as np

from shmbuf.core.schema import Field, as_count
from shmbuf.core.validate import check_cast

SIDES = ("right", "left")
INT32_MAX = int(np.iinfo(np.int32).max)


def as_lengths(lengths: Any, what: str = "lengths") -> np.ndarray:
    """``lengths`` as an int64 array of shape ``(n,)``, each >= 0 (not copied when it is
    one already); ``ValueError`` naming ``what`` otherwise.

    Examples:
        >>> as_lengths([3, 0, 2])
        array([3, 0, 2])
        >>> as_lengths([3, -1])
        Traceback (most recent call last):
        ...
        ValueError: lengths[1] is -1: a row's length must be >= 0
    """
    a = np.asarray(lengths)
    if a.ndim != 1:
        raise ValueError(f"{what} must be a 1-D array of row lengths, got shape {a.shape}")
    if a.size == 0:  # (np.asarray([]) is float64)
        return np.zeros(0, np.int64)
    if a.dtype.kind not in "iu":
        raise ValueError(f"{what} must be integers, got dtype {a.dtype}")
    if a.dtype.kind == "u" and a.dtype.itemsize == 8 and int(a.max()) > np.iinfo(np.int64).max:
        i = int(a.argmax())
        raise ValueError(f"{what}[{i}] is {a[i]}, more than an int64 holds")
    bad = np.flatnonzero(a < 0)
    if bad.size:
        raise ValueError(f"{what}[{bad[0]}] is {a[bad[0]]}: a row's length must be >= 0")
    return a.astype(np.int64, copy=False)


def padded_width(lengths: Any, multiple: int = 1, length: int | None = None) -> int:
    """The width ``L`` of a padded batch of rows of ``lengths``: the longest row's length
    rounded up to ``multiple``, or ``length`` when given (it must hold every row and be a
    multiple of ``multiple``).

    Examples:
        >>> padded_width([3, 5, 0], multiple=4)
        8
        >>> padded_width([3, 5], length=6)
        6
    """
    lens = as_lengths(lengths)
    multiple = as_count(multiple, "multiple", 1)
    longest = int(lens.max()) if lens.size else 0
    if length is None:
        return -(-longest // multiple) * multiple
    length = as_count(length, "length", 0)
    if length % multiple:
        raise ValueError(f"length={length} is not a multiple of multiple={multiple}: give a length "
                         "that is, or leave one of them out")
    if longest > length:
        raise ValueError(f"row {int(lens.argmax())} has length {longest}, more than length={length}: "
                         f"give length >= {longest}, or leave it out to pad to the longest row")
    return length


def _offsets_of(lens: np.ndarray) -> np.ndarray:
    offsets = np.zeros(len(lens) + 1, np.int64)
    np.cumsum(lens, out=offsets[1:])
    return offsets


class Jagged:
    """One ragged field of a batch: ``n`` rows of shape ``(L_i, *trailing)``, stored as
    ``values`` (``(total, *trailing)``) and ``offsets`` (int64, ``(n + 1,)``).

    Neither array is copied. ``j[i]`` is a view of row ``i``; ``j[idx]`` (a slice, an int
    array or a boolean mask) is a new ``Jagged`` with copies of the rows chosen.

    Examples:
        >>> j = Jagged(np.arange(5, dtype=np.int32), np.array([0, 2, 2, 5]))
        >>> j
        Jagged(n=3, total=5, dtype=int32)
        >>> j.lengths
        array([2, 0, 3])
        >>> j[2]
        array([2, 3, 4], dtype=int32)
        >>> j.padded(value=-1)
        array([[ 0,  1, -1],
               [-1, -1, -1],
               [ 2,  3,  4]], dtype=int32)
        >>> j[[2, 0]].offsets
        array([0, 3, 5])
    """

    __slots__ = ("_values", "_offsets")

    def __init__(self, values: np.ndarray, offsets: np.ndarray) -> None:
        values, offsets = np.asarray(values), np.asarray(offsets)
        if values.ndim < 1:
            raise ValueError(f"values must have a leading axis (shape (total, *trailing)), got a scalar {values!r}")
        if offsets.ndim != 1 or offsets.size == 0:
            raise ValueError(f"offsets must be a 1-D array of n + 1 positions, got shape {offsets.shape}")
        if offsets.dtype != np.int64:
            raise ValueError(f"offsets must be int64, got {offsets.dtype}: pass offsets.astype(np.int64)")
        if offsets[0] != 0:
            raise ValueError(f"offsets must start at 0, got offsets[0] = {offsets[0]}")
        down = np.flatnonzero(offsets[1:] < offsets[:-1])
        if down.size:
            i = int(down[0])
            raise ValueError(f"offsets must not decrease, got offsets[{i}] = {offsets[i]} > "
                             f"offsets[{i + 1}] = {offsets[i + 1]}")
        if offsets[-1] != len(values):
            raise ValueError(f"offsets must end at len(values) = {len(values)}, got offsets[-1] = {offsets[-1]}")
        self._values, self._offsets = values, offsets

    def __reduce__(self) -> tuple[Any, tuple[np.ndarray, np.ndarray]]:
        """Pickles as its two arrays (``Jagged(values, offsets)``, checked again when
        unpickled): one buffer each under pickle protocol 5, which Ray's serializer
        sends out of band, without a copy into the pickle.

        Examples:
            >>> import pickle
            >>> j = pickle.loads(pickle.dumps(Jagged.from_rows([[1, 2], [3]])))
            >>> j.values.tolist(), j.offsets.tolist()
            ([1, 2, 3], [0, 2, 3])
        """
        return (Jagged, (self._values, self._offsets))

    @property
    def values(self) -> np.ndarray:
        """Every row's values end to end: shape ``(total, *trailing)``."""
        return self._values

    @property
    def offsets(self) -> np.ndarray:
        """Where each row starts, and ``total`` last: int64, shape ``(n + 1,)``."""
        return self._offsets

    @property
    def lengths(self) -> np.ndarray:
        """Each row's length: int64, shape ``(n,)``."""
        return np.diff(self._offsets)

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def __repr__(self) -> str:
        trailing = self._values.shape[1:]
        more = f", trailing={trailing}" if trailing else ""
        return f"Jagged(n={len(self)}, total={len(self._values)}, dtype={self._values.dtype}{more})"

    def __getitem__(self, index: Any) -> "np.ndarray | Jagged":
        n = len(self)
        if isinstance(index, (int, np.integer)) and not isinstance(index, (bool, np.bool_)):
            i = operator.index(index)
            if not -n <= i < n:
                raise IndexError(f"row {i} is out of range for a Jagged of {n} rows")
            i %= n
            return self._values[self._offsets[i]:self._offsets[i + 1]]
        if isinstance(index, slice) and index.step in (None, 1):
            start, stop, _ = index.indices(n)
            stop = max(start, stop)
            o = self._offsets
            return Jagged(self._values[o[start]:o[stop]].copy(), o[start:stop + 1] - o[start])
        rows = np.arange(n)[index] if isinstance(index, slice) else self._rows(index)
        lens = self.lengths[rows]
        offsets = _offsets_of(lens)
        src = np.repeat(self._offsets[rows] - offsets[:-1], lens) + np.arange(offsets[-1])
        return Jagged(self._values[src], offsets)

    def _rows(self, index: Any) -> np.ndarray:
        """The rows an int array or a boolean mask chooses, as non-negative positions."""
        n = len(self)
        if isinstance(index, tuple):
            raise IndexError("a Jagged has one axis of rows: index it with an int, a slice, a list or "
                             f"1-D array of ints, or a boolean mask; got a tuple {index!r}")
        a = np.asarray(index)
        if a.dtype == np.bool_:
            if a.shape != (n,):
                raise IndexError(f"a boolean mask of a Jagged's rows must have shape ({n},), got {a.shape}")
            return np.flatnonzero(a)
        if a.ndim == 1 and a.size == 0:
            return np.zeros(0, np.intp)
        if a.ndim != 1 or a.dtype.kind not in "iu":
            raise IndexError(f"a Jagged is indexed by an int, a slice, a 1-D array of ints or a boolean "
                             f"mask of its {n} rows; got {type(index).__name__} of dtype {a.dtype}, shape {a.shape}")
        out = (a < -n) | (a >= n)
        if out.any():
            raise IndexError(f"row {a[out][0]} is out of range for a Jagged of {n} rows")
        return np.where(a < 0, a + n, a)

    def _width(self, side: str, multiple: int, length: int | None) -> int:
        if side not in SIDES:
            raise ValueError(f"side must be 'right' or 'left' (where the padding goes), got {side!r}")
        return padded_width(self.lengths, multiple, length)

    def padded(self, side: str = "right", value: Any = 0, multiple: int = 1, length: int | None = None,
               out: np.ndarray | None = None) -> np.ndarray:
        """The rows as one array ``(n, L, *trailing)``, each padded with ``value`` on
        ``side``; ``L`` is the longest row rounded up to ``multiple``, or ``length``.

        ``out``: an array of that shape and of ``values``' dtype to write into (checked
        before anything is written); returned.

        Examples:
            >>> j = Jagged.from_rows([[1, 2, 3], [4]], dtype=np.int64)
            >>> j.padded(side="left", multiple=4)
            array([[0, 1, 2, 3],
                   [0, 0, 0, 4]])
        """
        width = self._width(side, multiple, length)
        values = self._values
        trailing = values.shape[1:]
        pad = np.asarray(value)
        if not (values.dtype == np.bool_ and pad.dtype.kind in "iu" and np.isin(pad, (0, 1)).all()):
            check_cast(Field("value", trailing, values.dtype), pad)  # (0 and 1 pad bools)
        try:
            np.broadcast_to(pad, trailing)
        except ValueError:
            raise ValueError(f"value must be a scalar or broadcast to a row's trailing shape {trailing}, "
                             f"got shape {pad.shape}") from None
        shape = (len(self), width) + trailing
        if out is None:
            out = np.empty(shape, values.dtype)
        elif not isinstance(out, np.ndarray) or out.shape != shape or out.dtype != values.dtype:
            got = f"shape {out.shape}, dtype {out.dtype}" if isinstance(out, np.ndarray) else type(out).__name__
            raise ValueError(f"out must be an array of shape {shape} and dtype {values.dtype}, got {got}")
        elif not out.flags.writeable:
            raise ValueError("out is read-only: give a writeable array")
        rows, cols = self._places(side, width)
        if len(values) < out.shape[0] * width:
            out[...] = pad
        out[rows, cols] = values
        return out

    def _places(self, side: str, width: int) -> tuple[np.ndarray, np.ndarray]:
        """(row, column) in the padded array of each value."""
        lens = self.lengths
        rows = np.repeat(np.arange(len(lens)), lens)
        cols = np.arange(len(self._values)) - np.repeat(self._offsets[:-1], lens)
        if side == "left":
            cols += np.repeat(width - lens, lens)
        return rows, cols

    def mask(self, side: str = "right", multiple: int = 1, length: int | None = None) -> np.ndarray:
        """``(n, L)`` bool: True where :meth:`padded` (same arguments) holds a row's values.

        Examples:
            >>> Jagged.from_rows([[1, 2], [3]]).mask(side="left")
            array([[ True,  True],
                   [False,  True]])
        """
        width = self._width(side, multiple, length)
        cols, lens = np.arange(width), self.lengths[:, None]
        return cols < lens if side == "right" else cols >= width - lens

    def cu_seqlens(self) -> np.ndarray:
        """The offsets as int32 ``(n + 1,)``, as flash-attention's varlen kernels take them;
        ``ValueError`` when the rows hold more values than int32 counts.

        Examples:
            >>> Jagged.from_rows([[1, 2], [], [3]]).cu_seqlens()
            array([0, 2, 2, 3], dtype=int32)
        """
        total = int(self._offsets[-1])
        if total > INT32_MAX:
            raise ValueError(f"the rows hold {total} values, more than int32 offsets count ({INT32_MAX}): "
                             "take fewer rows at a time (shmbuf.ragged.batches.budget)")
        return self._offsets.astype(np.int32)

    def to_torch(self, device: Any = None) -> Any:
        """A torch jagged nested tensor (``torch.nested.nested_tensor_from_jagged``) over
        ``values`` and ``offsets``: no copy on the CPU; ``device`` copies both there.
        Needs PyTorch (``pip install 'shmbuf[torch]'``), imported only here. The first
        call of a process takes seconds (torch loads its nested tensors then), and torch
        may print a warning of its own. Read-only values (an Arrow batch's, a memory map's)
        give a tensor over the same read-only memory: do not write to it."""
        try:
            import torch
        except ImportError:
            raise ImportError("Jagged.to_torch needs PyTorch, an optional dependency: "
                              "pip install 'shmbuf[torch]'") from None
        with warnings.catch_warnings():  # (torch warns of read-only memory: said above)
            warnings.filterwarnings("ignore", "The given NumPy array is not writable", UserWarning)
            values, offsets = torch.from_numpy(self._values), torch.from_numpy(self._offsets)
        if device is not None:
            values, offsets = values.to(device), offsets.to(device)
        return torch.nested.nested_tensor_from_jagged(values, offsets)

    def to_arrow(self) -> Any:
        """A ``pyarrow.LargeListArray`` of the rows over the same memory (``values`` its
        child array, ``offsets`` its int64 offsets; trailing dimensions as fixed-size
        lists inside): no copy when ``values`` is C-contiguous and not bool. Needs pyarrow
        (``pip install 'shmbuf[arrow]'``), imported only here. See
        :mod:`shmbuf.ragged.arrow` (its examples, and ``to_table`` for a whole batch)."""
        from shmbuf.ragged.arrow import to_arrow
        return to_arrow(self._values, self._offsets)

    @classmethod
    def from_arrow(cls, arr: Any) -> "Jagged":
        """The rows of a pyarrow list array (``LargeListArray``, ``ListArray``, or a
        ``ChunkedArray`` of one): over the same memory where the layouts agree (int64
        offsets, one chunk, numbers that are not bool; a slice rebases its offsets), its
        values read-only then. ``ValueError`` for null rows. See :mod:`shmbuf.ragged.arrow`."""
        from shmbuf.ragged.arrow import from_arrow
        return cls(*from_arrow(arr))

    @classmethod
    def from_rows(cls, rows: Iterable[Any], dtype: Any = None, trailing: tuple[int, ...] | None = None) -> "Jagged":
        """A Jagged of copies of ``rows``, each an array of shape ``(L_i, *trailing)``.

        ``dtype``: the values' dtype (a value that does not fit is refused, as a buffer's
        write refuses it); by default the rows' common dtype (empty rows left out).
        ``trailing``: by default the first row's (an empty 1-D row fits any).

        Examples:
            >>> j = Jagged.from_rows([np.zeros((2, 3)), [], np.ones((1, 3))], dtype=np.float32)
            >>> j.values.shape, j.lengths
            ((3, 3), array([2, 0, 1]))
        """
        arrays = []
        for i, row in enumerate(rows):
            try:
                arrays.append(np.asarray(row))
            except (ValueError, TypeError) as exc:
                raise ValueError(f"row {i}: cannot make an array of it ({exc})") from None
        if trailing is None:
            trailing = next((a.shape[1:] for a in arrays if a.ndim != 1 or a.size), ())
        trailing = tuple(as_count(d, "a trailing dimension", 0) for d in trailing)
        for i, a in enumerate(arrays):
            if a.ndim == 1 and a.size == 0:
                arrays[i] = a.reshape((0,) + trailing)
            elif a.ndim == 0 or a.shape[1:] != trailing:
                raise ValueError(f"row {i} has shape {a.shape}; every row must have shape (L, *{trailing})")
        found = [a.dtype for a in arrays if a.size]
        src = functools.reduce(np.promote_types, found) if found else np.dtype(np.float64)
        want = src if dtype is None else np.dtype(dtype)
        if not arrays:
            return cls(np.empty((0,) + trailing, want), np.zeros(1, np.int64))
        values = np.concatenate(arrays, dtype=src, casting="unsafe")  # (empty rows' float64)
        if want != src:
            check_cast(Field("rows", trailing, want), values)
            values = values.astype(want)
        return cls(values, _offsets_of(np.array([len(a) for a in arrays], np.int64)))

    @classmethod
    def concatenate(cls, parts: Sequence["Jagged"]) -> "Jagged":
        """The rows of ``parts``, one after the other (their values of one dtype and
        trailing shape).

        Examples:
            >>> j = Jagged.concatenate([Jagged.from_rows([[1, 2]]), Jagged.from_rows([[3], []])])
            >>> j.lengths.tolist(), j.values.tolist()
            ([2, 1, 0], [1, 2, 3])
        """
        if not parts:
            raise ValueError("concatenate needs at least one Jagged")
        values = np.concatenate([p.values for p in parts])
        return cls(values, _offsets_of(np.concatenate([p.lengths for p in parts])))

    @classmethod
    def empties(cls, lengths: Any, fields: Sequence[tuple[Any, tuple[int, ...]]],
                block: np.ndarray | None = None) -> list["Jagged"]:
        """Jaggeds of the same ``n`` rows whose values are not initialised (to be written),
        all in one block of memory (each field's values at a multiple of 64 bytes of it,
        ``values.base``): field ``k`` (``fields[k]``: its dtype and trailing shape) has
        the lengths ``lengths[:, k]`` (ints ``(n, len(fields))``, each >= 0).

        ``block``: a 1-D writeable uint8 array to put them in (a batch's, reused), if it
        holds them; else a new one, a quarter larger than they need (sizes vary).

        Examples:
            >>> a, b = Jagged.empties([[2, 1], [0, 3]], [(np.int32, ()), (np.float32, (2,))])
            >>> a.offsets, b.values.shape, a.values.base is b.values.base
            (array([0, 2, 2]), (4, 2), True)
        """
        lens = np.asarray(lengths)
        if lens.ndim != 2 or lens.shape[1] != len(fields) or (lens.size and lens.dtype.kind not in "iu"):
            raise ValueError(f"lengths must be ints of shape (n, {len(fields)}), got {lens.dtype} {lens.shape}")
        if lens.size and lens.min() < 0:
            raise ValueError("lengths must be >= 0 (a row's length)")
        offsets = np.zeros((len(fields), len(lens) + 1), np.int64)  # (each field's: a row of it)
        np.cumsum(lens.T, axis=1, out=offsets[:, 1:])
        places, need = [], 0
        for (dtype, trailing), total in zip(fields, offsets[:, -1].tolist()):
            dtype, shape = np.dtype(dtype), (total,) + tuple(trailing)
            nbytes = math.prod(shape) * dtype.itemsize
            places.append((need, nbytes, dtype, shape))
            need += -(-nbytes // 64) * 64
        if block is None:
            block = np.empty(need, np.uint8)
        elif not (isinstance(block, np.ndarray) and block.dtype == np.uint8 and block.ndim == 1
                  and block.flags.c_contiguous and block.flags.writeable):
            raise ValueError("block must be a 1-D writeable C-contiguous uint8 array")
        elif block.nbytes < need:
            block = np.empty(need + need // 4, np.uint8)
        out = []
        for o, (at, nbytes, dtype, shape) in zip(offsets, places):
            self = cls.__new__(cls)  # (made right here: not checked again)
            self._values, self._offsets = block[at:at + nbytes].view(dtype).reshape(shape), o
            out.append(self)
        return out

    @classmethod
    def empty(cls, lengths: Any, dtype: Any, trailing: tuple[int, ...] = ()) -> "Jagged":
        """A Jagged of rows of ``lengths`` whose values are not initialised (to be written).

        Examples:
            >>> j = Jagged.empty([2, 0, 1], np.float32, (4,))
            >>> j.values.shape, j.offsets
            ((3, 4), array([0, 2, 2, 3]))
        """
        offsets = _offsets_of(as_lengths(lengths))
        trailing = tuple(as_count(d, "a trailing dimension", 0) for d in trailing)
        return cls(np.empty((int(offsets[-1]),) + trailing, np.dtype(dtype)), offsets)
