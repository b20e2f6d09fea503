"""Checking what users pass in, before anything is touched.

Values are accepted when numpy can cast them to the field's dtype under
``casting="same_kind"`` (float64 -> float32 and int -> float are fine; float -> int,
int -> bool and complex -> float are not). Integers going into a narrower or
differently signed integer field (``3`` into uint8) are accepted when every value
fits, and rejected when one would wrap around (which numpy's "same_kind" would allow).
This is stricter than imitation and fishyrl, which cast anything silently (a float
action 1.9 stored as int 1).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from .layout import Field


def _shape_str(shape: tuple[int, ...], lead: str | None = None) -> str:
    dims = ([lead] if lead else []) + [str(d) for d in shape]
    return "(" + ", ".join(dims) + ("," if len(dims) == 1 else "") + ")"


def check_keys(fields: Sequence[Field], data: Any, what: str = "data") -> None:
    if not isinstance(data, Mapping):
        raise TypeError(f"{what} must be a mapping of field name -> array, got {type(data).__name__}")
    names = [f.name for f in fields]
    missing = [n for n in names if n not in data]
    extra = [k for k in data if k not in names]
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing field(s) {missing}")
        if extra:
            parts.append(f"unexpected field(s) {extra}")
        raise ValueError(f"{what} does not match the buffer's fields {names}: " + "; ".join(parts))


def check_rows(fields: Sequence[Field], data: Any, single: bool) -> tuple[list[np.ndarray], int]:
    """Validate one transition (``single``) or a batch along axis 0.

    Returns the arrays in field order, each with a leading row axis, and the row count.
    """
    check_keys(fields, data, "a transition" if single else "a batch")
    arrays, lengths = [], {}
    for f in fields:
        try:
            a = np.asarray(data[f.name])
        except (ValueError, TypeError) as exc:
            raise ValueError(f"field {f.name!r}: cannot make an array of the value ({exc})") from None
        if single:
            if a.shape != f.shape:
                raise ValueError(
                    f"field {f.name!r}: expected one row of shape {_shape_str(f.shape)}, got "
                    f"shape {a.shape}; use extend() to add several rows along axis 0")
            a = a[np.newaxis]
        elif a.ndim != len(f.shape) + 1 or a.shape[1:] != f.shape:
            raise ValueError(
                f"field {f.name!r}: expected shape {_shape_str(f.shape, 'n')} (n rows along axis "
                f"0), got {a.shape}; use add() for a single transition")
        if a.dtype != f.dtype:
            _check_cast(f, a)
        arrays.append(a)
        lengths[f.name] = len(a)
    n = arrays[0].shape[0]
    if len(set(lengths.values())) > 1:
        raise ValueError(f"all fields must have the same number of rows, got {lengths}")
    if n == 0:
        raise ValueError("a batch must hold at least one row, got 0")
    return arrays, n


def _check_cast(f: Field, a: np.ndarray) -> None:
    if a.dtype.kind in "iu" and f.dtype.kind in "iu":
        if np.can_cast(a.dtype, f.dtype, "safe") or a.size == 0:
            return
        info = np.iinfo(f.dtype)
        lo, hi = a.min(), a.max()
        if lo < info.min or hi > info.max:
            raise ValueError(
                f"field {f.name!r}: values from {lo} to {hi} do not fit in {f.dtype} "
                f"([{info.min}, {info.max}]); they would wrap around")
        return
    if not np.can_cast(a.dtype, f.dtype, "same_kind"):
        raise TypeError(
            f"field {f.name!r}: cannot store {a.dtype} values in a {f.dtype} field without "
            f"losing their kind (casting='same_kind'); convert them first, e.g. "
            f"np.asarray(value).astype({str(f.dtype)!r})")


def check_out(fields: Sequence[Field], out: Any, lead: tuple[int, ...]) -> None:
    """Check preallocated output arrays: shape ``lead + field shape``, same dtype, C order."""
    check_keys(fields, out, "out")
    for f in fields:
        a = out[f.name]
        want = lead + f.shape
        if not isinstance(a, np.ndarray) or a.shape != want or a.dtype != f.dtype \
                or not a.flags.c_contiguous or not a.flags.writeable:
            got = (f"{type(a).__name__}" if not isinstance(a, np.ndarray)
                   else f"shape {a.shape}, dtype {a.dtype}"
                   + ("" if a.flags.c_contiguous else ", not C-contiguous")
                   + ("" if a.flags.writeable else ", read-only"))
            raise ValueError(
                f"out[{f.name!r}]: expected a writeable C-contiguous array of shape {want} and "
                f"dtype {f.dtype}, got {got}; Buffer.empty_batch() makes matching arrays")
