"""A trainer's batches of ragged rows: the rows that fit a token budget, micro-batches of
even token counts, buckets of similar lengths, the padding a padded batch would hold.

Each function takes the rows' lengths (``Jagged.lengths``, or any 1-D array of ints >= 0)
and returns positions into them, or a count; :func:`select` applies positions to a batch.
None changes its arguments.
"""

from __future__ import annotations

import heapq
from typing import Any, Mapping

import numpy as np

from shmbuf.core.schema import as_count
from shmbuf.ragged.jagged import Jagged, as_lengths, padded_width


def _groups(labels: np.ndarray, k: int) -> list[np.ndarray]:
    """The positions of each label ``0 .. k - 1``, each ascending."""
    order = np.argsort(labels, kind="stable")
    return np.split(order, np.cumsum(np.bincount(labels, minlength=k))[:-1])


def budget(lengths: Any, max_tokens: int) -> int:
    """How many rows, in order from the first, fit ``max_tokens`` tokens together: at least
    one (a first row longer than the budget is taken alone), 0 when there are no rows.

    Examples:
        >>> budget([3, 4, 5], 7)
        2
        >>> budget([10, 1], 5)
        1
    """
    lens = as_lengths(lengths)
    max_tokens = as_count(max_tokens, "max_tokens", 1)
    if not lens.size:
        return 0
    return max(1, int(np.searchsorted(np.cumsum(lens), max_tokens, side="right")))


def balanced(lengths: Any, k: int) -> list[np.ndarray]:
    """The rows' positions split into ``k`` micro-batches of token counts as even as this
    greedy split makes them: longest row first (ties: the earlier one), each onto the
    lightest part so far (ties: the lower part). No part holds more than the mean
    (``sum / k``) plus the longest row. Each part's positions ascend; a part may be empty
    (fewer rows than ``k``). The same lengths always give the same split.

    Examples:
        >>> [p.tolist() for p in balanced([5, 1, 4, 2, 3], 2)]
        [[0, 1, 3], [2, 4]]
    """
    lens = as_lengths(lengths)
    k = as_count(k, "k", 1)
    heap = [(0, b) for b in range(k)]  # (tokens, part): the lightest on top, then the lower part
    part = np.empty(len(lens), np.intp)
    tokens = lens.tolist()
    for i in np.argsort(-lens, kind="stable").tolist():
        held, b = heap[0]
        part[i] = b
        heapq.heapreplace(heap, (held + tokens[i], b))
    return _groups(part, k)


def buckets(lengths: Any, bounds: Any) -> list[np.ndarray]:
    """The rows' positions grouped by length: one group per bound (strictly ascending),
    a row in the first whose bound is >= its length; positions ascend in each group.
    Padded to its bound, a group's batch holds little padding.

    Examples:
        >>> [g.tolist() for g in buckets([5, 120, 16, 64, 3], [16, 64, 128])]
        [[0, 2, 4], [3], [1]]
    """
    lens = as_lengths(lengths)
    bounds = as_lengths(bounds, "bounds")
    if not bounds.size:
        raise ValueError("bounds must hold at least one length")
    if (np.diff(bounds) <= 0).any():
        raise ValueError(f"bounds must be strictly ascending, got {bounds.tolist()}")
    which = np.searchsorted(bounds, lens, side="left")
    over = np.flatnonzero(which == len(bounds))
    if over.size:
        i = int(over[0])
        raise ValueError(f"row {i} has length {lens[i]}, more than the last bound {bounds[-1]}: "
                         f"add a bound >= {lens[i]}")
    return _groups(which, len(bounds))


def select(batch: Mapping[str, Any], positions: Any) -> dict[str, Any]:
    """The rows of ``batch`` at ``positions`` (ints, negative from the end, in the order
    given): each ndarray field indexed on axis 0, each :class:`Jagged` field by its
    ``[]``. Every field must hold the same number of rows. Copies.

    Examples:
        >>> batch = {"tokens": Jagged.from_rows([[1, 2], [3], [4, 5, 6]]), "reward": np.array([0., 1., 2.])}
        >>> part = select(batch, [2, 0])
        >>> part["tokens"].lengths, part["reward"]
        (array([3, 2]), array([2., 0.]))
    """
    if not isinstance(batch, Mapping):
        raise TypeError(f"batch must be a mapping of field name -> array or Jagged, got {type(batch).__name__}")
    rows = {}
    for name, v in batch.items():
        if not isinstance(v, (np.ndarray, Jagged)) or isinstance(v, np.ndarray) and v.ndim == 0:
            what = "a 0-d ndarray" if isinstance(v, np.ndarray) else f"a {type(v).__name__}"
            raise TypeError(f"field {name!r} is {what}: select takes ndarray fields (rows on axis 0) "
                            "and Jagged fields")
        rows[name] = len(v)
    if len(set(rows.values())) > 1:
        raise ValueError(f"the batch's fields hold different numbers of rows: {rows}")
    pos = np.asarray(positions)
    if pos.ndim != 1 or (pos.size and pos.dtype.kind not in "iu"):
        raise ValueError(f"positions must be a 1-D array of ints, got dtype {pos.dtype}, shape {pos.shape}")
    n = next(iter(rows.values()), 0)
    out = (pos < -n) | (pos >= n)
    if out.any():
        raise IndexError(f"position {pos[out][0]} is out of range for a batch of {n} rows")
    pos = pos.astype(np.intp, copy=False) if pos.size else np.zeros(0, np.intp)
    return {name: v[pos] for name, v in batch.items()}


def padding(lengths: Any, multiple: int = 1) -> float:
    """The fraction of a padded batch of these rows (:meth:`Jagged.padded` with
    ``multiple``) that would be padding; 0.0 for no rows.

    Examples:
        >>> padding([4, 2, 2])
        0.3333333333333333
        >>> padding([4, 4], multiple=8)
        0.5
    """
    lens = as_lengths(lengths)
    slots = len(lens) * padded_width(lens, multiple)
    return 0.0 if slots == 0 else (slots - int(lens.sum())) / slots


OFFSETS = ".offsets"
"""The suffix of a ragged field's offsets among a batch's named arrays (:func:`as_arrays`)."""


def as_arrays(batch: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """A batch as named arrays, for the formats that hold those (HDF5 datasets,
    safetensors tensors, ``np.savez``): a fixed field as it is, a ragged field
    (:class:`Jagged`) as two: ``name``, its values ``(total, *trailing)``, and
    ``name + ".offsets"``, its offsets (int64 ``(n + 1,)``). No copy. :func:`from_arrays`
    reads them back. ``ValueError`` if a field's name is another's offsets'.

    Examples:
        >>> b = {"r": Jagged.from_rows([[1, 2], [3]]), "k": np.array([7, 8])}
        >>> {k: a.tolist() for k, a in as_arrays(b).items()}
        {'r': [1, 2, 3], 'r.offsets': [0, 2, 3], 'k': [7, 8]}
        >>> from_arrays(as_arrays(b))["r"][0].tolist()
        [1, 2]
    """
    out: dict[str, np.ndarray] = {}
    for name, value in batch.items():
        parts = {name: value.values, name + OFFSETS: value.offsets} if isinstance(value, Jagged) \
            else {name: np.asarray(value)}
        clash = sorted(set(parts) & (set(out) | set(batch) - {name}))
        if clash:
            raise ValueError(f"field {name!r}: the array {clash[0]!r} would hold both it and another field "
                             f"(a ragged field's offsets are named name + {OFFSETS!r}); rename one of them")
        out.update(parts)
    return out


def from_arrays(arrays: Mapping[str, Any]) -> dict[str, Any]:
    """A batch from its named arrays (:func:`as_arrays`'): ``name`` with
    ``name + ".offsets"`` a :class:`Jagged` (checked: ``ValueError`` for offsets that are
    not int64, decrease or do not end at the values' end), any other array a fixed field;
    every field must hold the same number of rows."""
    out: dict[str, Any] = {}
    for name, a in arrays.items():
        if name.endswith(OFFSETS) and name[:-len(OFFSETS)] in arrays:
            continue
        if name + OFFSETS in arrays:
            try:
                out[name] = Jagged(np.asarray(a), np.asarray(arrays[name + OFFSETS]))
            except ValueError as exc:
                raise ValueError(f"field {name!r} (its values, and {name + OFFSETS!r}): {exc}") from None
        else:
            out[name] = np.asarray(a)
    rows = {k: len(v) for k, v in out.items()}
    if len(set(rows.values())) > 1:
        raise ValueError(f"the fields hold different numbers of rows: {rows}")
    return out
