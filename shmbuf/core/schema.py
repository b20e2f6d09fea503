"""The schema: a buffer's named fields, each a row ``shape`` and a ``dtype``, checked
(:func:`normalize_fields`) and read back from JSON (:func:`dtype_from_json`)."""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
from numpy.lib import format as npformat

MAX_DIMS = 62
"""Dimensions a field's rows may have: a batch of sequences adds two axes, and numpy
arrays have at most 64 (32 before numpy 2, so fewer there)."""

@dataclass(frozen=True)
class Field:
    """One named array of the buffer: each row has ``shape`` and ``dtype``."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    offset: int = 0
    stride: int = 0  # bytes from one row to the next; row_bytes for a field of its own

    @property
    def row_bytes(self) -> int:
        return self.dtype.itemsize * math.prod(self.shape)

    @property
    def packed(self) -> bool:
        return self.stride != self.row_bytes


def _max_dims() -> int:
    """:data:`MAX_DIMS`, or fewer where numpy allows fewer than 64 dimensions."""
    global _MAX_DIMS_HERE
    if _MAX_DIMS_HERE is None:
        try:
            np.empty((1,) * 64)
            _MAX_DIMS_HERE = MAX_DIMS
        except ValueError:  # numpy 1.x: 32
            _MAX_DIMS_HERE = 30
    return _MAX_DIMS_HERE


_MAX_DIMS_HERE: int | None = None


def as_count(value: Any, what: str, minimum: int = 1) -> int:
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{what} must be an integer, got {value!r}")
    try:
        n = operator.index(value)
    except TypeError:
        raise TypeError(f"{what} must be an integer, got {type(value).__name__} {value!r}") from None
    if n < minimum:
        raise ValueError(f"{what} must be >= {minimum}, got {n}")
    return n


def normalize_fields(fields: Mapping[str, Any]) -> list[Field]:
    """Check a ``{name: (shape, dtype)}`` schema and return its fields, in order.

    ``shape`` is a tuple of non-negative ints or one int (``()`` for scalars); ``dtype``
    is anything ``numpy.dtype`` accepts except object dtypes.
    """
    if not isinstance(fields, Mapping) or not fields:
        raise ValueError(
            f"fields must be a non-empty mapping of name -> (shape, dtype), got {fields!r}; "
            'for example {"obs": ((17,), np.float32), "reward": ((), np.float32)}'
        )
    out = []
    for name, spec in fields.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"field names must be non-empty strings, got {name!r}")
        if not isinstance(spec, (tuple, list)) or len(spec) != 2:
            raise ValueError(
                f"field {name!r}: expected a (shape, dtype) pair such as ((17,), np.float32), "
                f"got {spec!r}"
            )
        shape_in, dtype_in = spec
        if isinstance(shape_in, (tuple, list)):
            shape = tuple(as_count(d, f"field {name!r}: shape dimension", 0) for d in shape_in)
        else:
            shape = (as_count(shape_in, f"field {name!r}: shape", 0),)
        if len(shape) > _max_dims():
            raise ValueError(f"field {name!r}: shape {shape} has {len(shape)} dimensions; at most "
                             f"{_max_dims()} are supported")
        try:
            dtype = np.dtype(_torch_dtype(dtype_in))
        except TypeError as exc:
            raise TypeError(f"field {name!r}: {dtype_in!r} is not a numpy dtype ({exc})") from None
        if dtype.hasobject:
            raise TypeError(
                f"field {name!r}: dtype {dtype} holds Python objects, which cannot live in "
                "shared memory; use a numeric, bool, fixed-size string or structured dtype"
            )
        if dtype.subdtype is not None:  # ('f4', (3,)) is a (3,) float32 sub-array
            dtype, sub = dtype.subdtype
            shape = shape + sub
            if len(shape) > _max_dims():
                raise ValueError(f"field {name!r}: shape {shape} (with the dtype's sub-array) has "
                                 f"{len(shape)} dimensions; at most {_max_dims()} are supported")
        field = Field(name, shape, dtype)
        if field.row_bytes == 0:
            raise ValueError(
                f"field {name!r}: shape {shape} with dtype {dtype} stores 0 bytes per row; "
                "every field needs at least one byte"
            )
        out.append(field)
    return out


def _torch_dtype(dtype: Any) -> Any:
    """A ``torch.dtype`` as the numpy dtype of the same name (torch is never imported
    here); anything else as it is."""
    if type(dtype).__module__ != "torch" or not str(dtype).startswith("torch."):
        return dtype
    try:
        return np.dtype(str(dtype)[len("torch."):])
    except TypeError:
        raise TypeError(f"{dtype} has no numpy equivalent: store such a field as another dtype "
                        "(bfloat16 as float32, say) and convert after sampling") from None


def dtype_from_json(descr: Any) -> np.dtype:
    """The dtype of a numpy descr read back from JSON (what ``npformat.dtype_to_descr``
    gave, its tuples turned into lists): raises ``ValueError``/``TypeError``/``KeyError``
    for anything else."""
    return npformat.descr_to_dtype(_tupleize(descr))


def _tupleize(descr: Any) -> Any:
    """JSON turns the tuples of a numpy descr into lists; turn them back.

    A list of ints is a shape (a tuple); any other list is a list of field tuples.
    """
    if not isinstance(descr, list):
        return descr
    if all(isinstance(x, int) for x in descr):
        return tuple(descr)
    return [tuple(_tupleize(x) for x in item) for item in descr]
