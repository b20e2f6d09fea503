"""Casting the way the reference libraries do (into the field's dtype, silently), except
where a value would not survive the cast: then a clear error, before anything is written."""

from __future__ import annotations

from typing import Any

import numpy as np

from shmbuf.core import validate


def into(value: Any, dtype: np.dtype, key: str) -> np.ndarray:
    """``value`` as an array of ``dtype``: floats into integer fields are truncated (1.9
    -> 1) as numpy's ``astype`` does, but NaN, infinities and values outside the integer
    type's range raise ``ValueError`` naming ``key``.

    Examples:
        >>> into([1.9, -2.5], np.dtype(np.int32), "x").tolist()
        [1, -2]
    """
    a = np.asarray(value)
    dtype = np.dtype(dtype)
    if a.dtype == dtype:
        return a
    if dtype.kind in "iu" and a.dtype.kind in "fiub" and a.size:
        if a.dtype.kind == "f":
            if not np.isfinite(a).all():
                raise ValueError(f"{key!r}: NaN or infinite values cannot be stored in a {dtype} field")
            validate.fits_integer(repr(key), np.trunc(a.min()), np.trunc(a.max()), dtype)
        else:
            validate.fits_integer(repr(key), a.min(), a.max(), dtype)
    try:
        return a.astype(dtype)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{key!r}: cannot store {a.dtype} values in a {dtype} field ({exc})") from None
