"""Batches: the arrays a sample is copied into, made or checked once per ``out=``."""

from __future__ import annotations

import math
import operator
from typing import Any, Sequence

import numpy as np

from shmbuf.core import pool, validate

Batch = dict[str, np.ndarray]


def rows_of(data: Any) -> int:
    """The rows of a batch (a mapping of fields), as its first field's length says; 0 if
    it has none or that field has no length (the schema check then explains the batch)."""
    try:
        return len(next(iter(data.values())))
    except (TypeError, StopIteration):
        return 0


def count(value: Any, what: str, minimum: int = 0) -> int:
    """``value`` as an int >= ``minimum``; ``TypeError``/``ValueError`` naming ``what``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{what} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"{what} must be >= {minimum}, got {value}")
    return int(value)


def as_out(out: Any, batch: Any) -> Any:
    """``out`` (a dict given as ``out=``; None: ``batch``) refilled with ``batch``'s
    fields, and returned.

    Examples:
        >>> out = {"x": 1, "old": 2}
        >>> as_out(out, {"x": 3}) is out, out
        (True, {'x': 3})
    """
    if out is None or out is batch:
        return batch
    if not isinstance(out, dict):
        raise ValueError(f"out must be a dict (a batch a read returned), got {type(out).__name__}")
    out.clear()
    out.update(batch)
    return out


class Outputs:
    """Makes a handle's batches, or checks a caller's ``out=`` (once: the same arrays
    again pass on an identity test).

    Examples:
        >>> from shmbuf.core.layout import Layout
        >>> fields = Layout.plan({"x": ((2,), "f4")}, 4, 1, 0, (1, 0.0), 0.0, None, {}).fields
        >>> out, arrays = Outputs(fields).prepare(None, (3,))
        >>> out["x"].shape, len(arrays)
        ((3, 2), 1)
    """

    def __init__(self, fields: Sequence[Any]) -> None:
        self.fields = list(fields)
        self.names = [f.name for f in self.fields]
        self.row_bytes = sum(f.row_bytes for f in self.fields)
        self._checked: list[Any] = []  # the last out= that passed its check, and its shape
        self._lead: tuple[int, ...] = ()

    def empty(self, lead: tuple[int, ...], pooled: bool = False) -> Batch:
        """Uninitialised arrays ``{name: (*lead, *shape)}`` (``pooled``: from the
        process's batch memory, :mod:`shmbuf.core.pool`; else fresh, for a caller to keep)."""
        if pooled and math.prod(lead) * self.row_bytes >= pool.SMALL:  # (small: np.empty, cheaper)
            return dict(zip(self.names, pool.empty([(lead + f.shape, f.dtype) for f in self.fields])))
        return {f.name: np.empty(lead + f.shape, f.dtype) for f in self.fields}

    def prepare(self, out: Batch | None, lead: tuple[int, ...]) -> tuple[Batch, list[np.ndarray]]:
        """``out`` (made if None, checked if new) and its arrays in field order."""
        if out is None:
            try:
                out = self.empty(lead, pooled=True)
            except (ValueError, MemoryError):
                rows = math.prod(lead)
                raise ValueError(
                    f"cannot allocate a batch of {rows:,} rows ({rows * self.row_bytes:,} "
                    "bytes); ask for fewer rows per call") from None
            return out, list(out.values())
        try:
            arrays = [out[k] for k in self.names]
        except (KeyError, TypeError):
            arrays = []
        key = [out, *arrays]
        if lead != self._lead or len(key) != len(self._checked) \
                or not all(map(operator.is_, key, self._checked)):
            validate.check_out(self.fields, out, lead)
            self._checked, self._lead = key, lead
        return out, arrays
