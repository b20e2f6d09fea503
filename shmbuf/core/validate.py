"""Checking what users pass in, before anything is touched.

Values are accepted when numpy can cast them to the field's dtype under
``casting="same_kind"`` (float64 -> float32 and int -> float are fine; float -> int,
int -> bool and complex -> float are not). Integers going into a narrower or
differently signed integer field (``3`` into uint8) are accepted when every value
fits, and rejected when one would wrap around (which numpy's "same_kind" would allow).
Likewise values that would not survive the cast are rejected: strings longer than a
fixed-size string field (``b"episode-17"`` into ``S4``) and finite numbers beyond a
narrower float's range (70000 into ``float16`` would become ``inf``). Precision loss
(float64 -> float32) is accepted. This is stricter than imitation and fishyrl, which
cast anything silently (a float action 1.9 stored as int 1).
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Mapping, Sequence

import numpy as np

from shmbuf.core.layout import Field


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


class Schema:
    """The fields of a buffer, prepared for fast checks of incoming rows."""

    def __init__(self, fields: Sequence[Field]) -> None:
        self.fields = tuple(fields)
        self.names = frozenset(f.name for f in fields)
        self._specs = [(f.name, f.shape, f.dtype, f) for f in fields]

    def check_rows(self, data: Any, single: bool) -> tuple[list[np.ndarray], int]:
        """Validate one transition (``single``) or a batch along axis 0.

        Returns the arrays in field order (a single transition's without a row axis)
        and the row count. Raises before anything is written.
        """
        if not isinstance(data, Mapping) or data.keys() != self.names:
            check_keys(self.fields, data, "a transition" if single else "a batch")
        arrays = []
        n = -1
        for name, shape, dtype, f in self._specs:
            a = data[name]
            if type(a) is not np.ndarray:
                try:
                    a = np.asarray(a)
                except (ValueError, TypeError) as exc:
                    raise ValueError(f"field {name!r}: cannot make an array of the value ({exc})") from None
            if single:
                if a.shape != shape:
                    raise ValueError(
                        f"field {name!r}: expected one row of shape {_shape_str(shape)}, got "
                        f"shape {a.shape}; use extend() to add several rows along axis 0")
            else:
                if a.shape[1:] != shape or a.ndim != len(shape) + 1:
                    raise ValueError(
                        f"field {name!r}: expected shape {_shape_str(shape, 'n')} (n rows along "
                        f"axis 0), got {a.shape}; use add() for a single transition")
                if n != len(a):
                    if n >= 0:
                        raise ValueError("all fields must have the same number of rows, got "
                                         f"{ {k: len(v) for k, v in zip(self.names_in_order(), arrays + [a])} }")
                    n = len(a)
            if a.dtype is not dtype and a.dtype != dtype:
                check_cast(f, a)
            arrays.append(a)
        if single:
            return arrays, 1
        if n == 0:
            raise ValueError("a batch must hold at least one row, got 0")
        return arrays, n

    def names_in_order(self) -> list[str]:
        return [f.name for f in self.fields]


def timeout(value: Any, what: str = "timeout") -> float:
    """``value`` as a float number of seconds, or a clear error (not negative, not NaN,
    not a bool; ``inf`` waits without limit)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{what} must be a number of seconds, got {value!r}")
    value = float(value)
    if math.isnan(value) or value < 0:
        raise ValueError(f"{what} must be a number of seconds >= 0, got {value!r}")
    return value


def flag(value: Any, what: str) -> bool:
    """``value`` if it is a bool (numpy's too); else a TypeError: a truthy string such as
    ``"False"`` must not quietly mean True."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{what} must be True or False, got {value!r}")
    return bool(value)


def rng(seed: Any) -> np.random.Generator:
    """``numpy.random.default_rng(seed)`` with an error that says what a seed may be."""
    try:
        return np.random.default_rng(seed)
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"seed must be None, a non-negative int, a sequence of them, a SeedSequence or a "
            f"numpy Generator/BitGenerator; got {seed!r} ({exc})") from None


def fits_integer(what: str, lo: Any, hi: Any, dtype: np.dtype) -> None:
    """``ValueError`` naming ``what`` unless every value from ``lo`` to ``hi`` fits in the
    integer ``dtype`` (else a cast would wrap them around)."""
    info = np.iinfo(dtype)
    if lo < info.min or hi > info.max:
        raise ValueError(f"{what}: values from {lo} to {hi} do not fit in {dtype} "
                         f"([{info.min}, {info.max}]); they would wrap around")


def check_cast(f: Field, a: np.ndarray) -> None:
    src, dst = a.dtype, f.dtype
    if dst.kind in "SU" and np.can_cast(src, dst, "same_kind"):
        # a string field: every value's text must fit, numbers' (their str()) included
        chars = dst.itemsize // (4 if dst.kind == "U" else 1)
        text = a if src.kind in "SU" else a.astype(dst.kind)  # (unsized: as long as needed)
        lengths = np.char.str_len(text)
        longest = int(lengths.max()) if a.size else 0
        if longest > chars:
            what = f"a value of {longest} characters" if src.kind in "SU" else \
                f"{src} values are stored as their text, and {text.flat[int(lengths.argmax())].item()!r} has {longest} characters: it"
            raise ValueError(
                f"field {f.name!r}: {what} does not fit in {dst} (at most {chars}); it would be "
                "cut short. Create the field with a longer string dtype")
        return
    if dst.kind == "f" and src.kind in "iuf" and not np.can_cast(src, dst, "safe") and a.size:
        big = float(np.finfo(dst).max)
        if src.kind in "iu" and np.iinfo(src).max <= big:
            return  # every integer of src fits (with rounding)
        if max(abs(float(a.min())), abs(float(a.max()))) <= big:
            return  # the common case; NaN and inf fall through to the exact check
        finite = a[np.isfinite(a)]
        if finite.size and float(np.abs(finite).max()) > big:
            raise ValueError(
                f"field {f.name!r}: values up to {float(np.abs(finite).max()):g} do not fit in "
                f"{dst} (largest finite {float(big):g}); they would become inf")
        return
    if src.kind in "iu" and dst.kind in "iu":
        if not np.can_cast(a.dtype, f.dtype, "safe") and a.size:
            fits_integer(f"field {f.name!r}", a.min(), a.max(), f.dtype)
        return
    if not np.can_cast(src, dst, "same_kind"):
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
