"""Ragged rows in a :class:`~shmbuf.compat.torchrl.storage.SharedStorage`: TensorDicts
whose entries differ in their leading length from row to row (a lazy stack, as TorchRL's
LLM collectors write: tokens, log-probabilities, masks), kept as shmbuf's ragged fields
(:mod:`shmbuf.ragged`) and read back as TorchRL's ``LazyStackStorage`` gives them: a
``LazyStackedTensorDict`` of the rows.

**The schema, from the first write.** An entry whose shape differs from row to row in
its first dimension only is a ragged field (one row ``(L, *trailing)``); one whose rows
all have one shape is a fixed field, unless ``ragged=`` names it (or is True: every
entry with a dimension). Ragged entries whose lengths agree in every row of the first
write, and vary there, share one length (named after the first of them: each later
write must keep them equal); ``ragged={key: None}`` gives a key a length of its own,
``{key: "R"}`` a length of that name. What is refused, naming the key: rows that differ
in a dimension after the first, in their number of dimensions or in dtype, and entries
that are not tensors (strings, ``NonTensorData``).

**The arena.** ``arena=`` bytes (every lane's together) hold the ragged values; by
default, made at the first write: room for ``max_size`` rows twice the mean size of the
first write's rows, at least 1 MiB (see :func:`default_arena`). A row's values take its
ragged entries' bytes, each rounded up to 8. One row larger than a lane's arena is
refused before anything is written; an extend larger than a lane's arena is written in
parts, its oldest rows covered by its newest (a replay buffer keeps fewer rows than
``max_size`` when its arena is too small: ``len`` says how many).

Examples:
    >>> import torch
    >>> from tensordict import TensorDict, lazy_stack
    >>> rows = lazy_stack([TensorDict(tokens=torch.arange(n), reward=torch.tensor(1.0)) for n in (3, 5)])
    >>> cols = columns(rows)
    >>> fields, names = plan(cols, None)
    >>> fields["tokens"][0], fields["reward"][0], names
    ((None,), (), {'tokens': None})
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import numpy as np
import torch
from tensordict import LazyStackedTensorDict, NonTensorStack, TensorDict, TensorDictBase, lazy_stack

SEP = "."
MIB = 1 << 20
PAD = 8  # a ragged field's values in a record: rounded up to 8 bytes (shmbuf.core.arena)


def key_name(key: Any) -> str:
    """A TensorDict key (a string or a tuple of nested ones) as a field's name."""
    return key if isinstance(key, str) else SEP.join(key)


def columns(td: TensorDictBase) -> dict[str, torch.Tensor | list[torch.Tensor]]:
    """Each tensor entry of ``td`` by its joined key: a tensor ``(n, ...)`` when its rows
    have one shape, else the list of its ``n`` rows (a lazy stack along dimension 0 of
    rows of a batch size ``[]``). ``ValueError`` naming the key for what a shmbuf field
    cannot hold."""
    lazy = isinstance(td, LazyStackedTensorDict)
    out: dict[str, Any] = {}
    for key in td.keys(True, True):
        name = key_name(key)
        try:
            out[name] = td.get(key)
            continue
        except RuntimeError:
            if not (lazy and td.stack_dim == 0 and td.batch_dims == 1):
                raise ValueError(
                    f"key {name!r}: its rows differ in shape along the batch dimension {td.stack_dim} of a lazy "
                    f"stack of batch size {list(td.batch_size)}: shmbuf keeps rows stacked along their first "
                    "dimension (rows of a batch size [], each ragged in its first dimension); stack them along "
                    "dimension 0, or pad them to one shape") from None
        rows = list(td.get(key, as_list=True))
        if any(not isinstance(r, torch.Tensor) or r.is_nested for r in rows):
            raise ValueError(f"key {name!r}: rows of {type(rows[0]).__name__}: a shmbuf field holds tensors")
        out[name] = rows
    found = [key_name(k) for k in td.keys(True, True, is_leaf=_not_td) if key_name(k) not in out]
    if found:
        raise ValueError(f"key {found[0]!r} holds no tensor (a string, NonTensorData or a tensorclass): a shmbuf "
                         "field holds tensors; exclude it before the extend (td.exclude(key)), or keep it as "
                         "token ids")
    return out


def _not_td(cls: type) -> bool:
    """A leaf: anything but a TensorDict (a tensor, a tensorclass, non-tensor data or a stack of it)."""
    return not issubclass(cls, TensorDictBase) or issubclass(cls, NonTensorStack)


def _shapes(name: str, rows: list[torch.Tensor]) -> tuple[tuple[int, ...], torch.dtype]:
    """The trailing shape and the dtype the rows of a ragged entry share (else ValueError)."""
    first = rows[0]
    for i, r in enumerate(rows):
        if r.ndim == 0 or r.ndim != first.ndim:
            raise ValueError(f"key {name!r}: row {i} has the shape {list(r.shape)}, row 0 {list(first.shape)}: the "
                             "rows of a ragged entry must differ in their first dimension only")
        if r.shape[1:] != first.shape[1:]:
            raise ValueError(f"key {name!r}: row {i} has the shape {list(r.shape)}, row 0 {list(first.shape)}: they "
                             "differ in a dimension after the first, which a shmbuf ragged field keeps fixed; pad "
                             "that dimension to one size (only the first may vary)")
        if r.dtype != first.dtype:
            raise ValueError(f"key {name!r}: row {i} is {r.dtype}, row 0 {first.dtype}: cast them to one dtype")
    return tuple(first.shape[1:]), first.dtype


def plan(cols: Mapping[str, Any], ragged: Any) -> tuple[dict[str, tuple[tuple[Any, ...], torch.dtype]], dict]:
    """The fields of the first write's columns: ``{name: (shape, torch dtype)}`` (a ragged
    one's shape starts with its length, None or a name) and ``{ragged name: its length
    name or None}``. ``ragged``: None (the entries whose rows differ), True (every entry
    with a dimension), keys, or ``{key: length name or None}``."""
    every = ragged is True
    given = {} if ragged is None or every else _given(ragged)
    unknown = sorted(set(given) - set(cols))
    if unknown:
        raise ValueError(f"ragged= names {unknown}, which the first rows do not have (their keys: {sorted(cols)})")
    fields: dict[str, Any] = {}
    lengths: dict[str, np.ndarray] = {}
    for name, col in cols.items():
        if isinstance(col, list):
            trailing, dtype = _shapes(name, col)
            lengths[name] = np.array([len(r) for r in col], np.int64)
        elif name in given or (every and col.ndim > 1):
            if col.ndim < 2:
                raise ValueError(f"key {name!r}: ragged= names it, but its rows are scalars (shape "
                                 f"{list(col.shape)}): a ragged entry has a first dimension")
            trailing, dtype = tuple(col.shape[2:]), col.dtype
            lengths[name] = np.full(len(col), col.shape[1], np.int64)
        else:
            fields[name] = (tuple(col.shape[1:]), col.dtype)
            continue
        fields[name] = (trailing, dtype)
    names: dict[str, Any] = {}
    for name, ls in lengths.items():
        if name in given:
            names[name] = given[name]
            continue
        names[name] = None
        if len(np.unique(ls)) < 2:
            continue  # (lengths alike in every row say nothing of the next rows)
        for other in names:
            if other != name and other not in given and np.array_equal(lengths[other], ls):
                names[name] = names[other] if names[other] is not None else other
                names[other] = names[name]
                break
    shaped = {k: ((names[k], *fields[k][0]), fields[k][1]) if k in names else fields[k] for k in fields}
    return shaped, names


def _given(ragged: Any) -> dict[str, Any]:
    if isinstance(ragged, Mapping):
        items = [(key_name(k), v) for k, v in ragged.items()]
    elif isinstance(ragged, (str, tuple)) or not isinstance(ragged, Iterable):
        raise TypeError(f"ragged= takes True, a list of keys or a dict {{key: length name or None}}, got {ragged!r}")
    else:
        items = [(key_name(k), None) for k in ragged]
    for k, v in items:
        if v is not None and not (isinstance(v, str) and v):
            raise ValueError(f"ragged=: the length of {k!r} must be a name (a non-empty string) or None, got {v!r}")
    return dict(items)


def row_bytes(lengths: Mapping[str, np.ndarray], element: Mapping[str, int]) -> np.ndarray:
    """Each row's bytes of ragged values: per field ``length * element bytes``, each
    rounded up to 8 (a record's layout, :mod:`shmbuf.core.arena`)."""
    total = 0
    for k, ls in lengths.items():
        total = total + -(-ls * element[k] // PAD) * PAD
    return np.asarray(total, np.int64)


def default_arena(rows: np.ndarray, max_size: int, lanes: int) -> int:
    """``arena=`` when none was given: twice ``max_size`` rows of the mean size of the
    first write's rows (``rows``: their bytes), at least 1 MiB, and room for that write
    whole in each lane."""
    mean = float(rows.mean()) if len(rows) else 0.0
    want = max(MIB, int(2 * max_size * mean), lanes * 2 * int(rows.sum()))
    return -(-want // MIB) * MIB


def parts(rows: np.ndarray, limit: int, lane_arena: int) -> list[tuple[int, int]]:
    """The rows ``[a, b)`` of each write of an extend: at most ``limit`` rows and
    ``lane_arena`` bytes each (``rows``: each row's bytes, none larger than a lane's arena)."""
    out, a, used = [], 0, 0
    for i, b in enumerate(rows.tolist()):
        if i - a == limit or used + b > lane_arena:
            out.append((a, i))
            a, used = i, 0
        used += b
    out.append((a, len(rows)))
    return out


def values(flat: Mapping[str, Any], n: int, lengths_: Mapping[str, Any], element: Mapping[str, int], lane_arena: int,
           lanes: int) -> dict[str, list[np.ndarray]]:
    """The ragged entries (``lengths_``: their length names) of ``n`` rows' columns, one
    array per row, checked: present, their shared lengths agreeing, each row within a
    lane's arena (the buffer's write checks their shapes and dtypes)."""
    missing = sorted(k for k in lengths_ if k not in flat)
    if missing:
        raise ValueError(f"the rows lack {missing}, ragged entries of this buffer: each write holds every ragged "
                         "entry (a row of length 0 is an empty tensor)")
    out, lengths, seen = {}, {}, {}
    for k, dim in lengths_.items():
        col = flat[k]
        rows = [r.detach().cpu().numpy() for r in col] if isinstance(col, list) else list(col.detach().cpu().numpy())
        out[k] = rows
        lengths[k] = ls = np.array([len(r) if r.ndim else -1 for r in rows], np.int64)
        first, theirs = seen.setdefault(dim if dim is not None else k, (k, ls))
        if not np.array_equal(theirs, ls):
            i = int(np.flatnonzero(theirs != ls)[0])
            raise ValueError(f"row {i}: key {k!r} holds {ls[i]} values, {first!r} {theirs[i]}: the storage gave "
                             f"them one length, {dim!r} (they agreed in every row of its first write); nothing "
                             f"was written. Make the storage with ragged={{{k!r}: None}} to give {k!r} a length "
                             "of its own")
    size = row_bytes({k: np.maximum(ls, 0) for k, ls in lengths.items()}, element)
    if len(size) and size.max() > lane_arena:
        i = int(np.argmax(size))
        raise ValueError(f"row {i}'s ragged values take {int(size[i]):,} bytes, more than a lane's arena "
                         f"({lane_arena:,} bytes: arena= over {lanes} lane(s)); nothing was "
                         "written. Make the storage with a larger arena=")
    return out



def lengths_of(cols: Mapping[str, Any], names: Iterable[str]) -> dict[str, np.ndarray]:
    """Each row's length of the ragged entries ``names`` of ``cols`` (:func:`columns`)."""
    return {k: np.array([len(r) for r in cols[k]], np.int64) if isinstance(cols[k], list)
            else np.full(len(cols[k]), cols[k].shape[1], np.int64) for k in names}


def lazy_rows(got: Mapping[str, Any], keys: list[str], ragged: set[str], n: int,
              row_shape: tuple[int, ...] = ()) -> TensorDictBase:
    """``n`` rows read (fixed fields arrays, ragged ones :class:`~shmbuf.Jagged`) as TorchRL's
    ``LazyStackStorage`` returns them: a lazy stack of one TensorDict per row, each row's
    ragged entries tensors over the values read (no copy)."""
    paths = {k: tuple(k.split(SEP)) for k in keys}
    fixed = {paths[k]: torch.as_tensor(got[k]) for k in keys if k not in ragged}
    values = {paths[k]: (torch.from_numpy(got[k].values), got[k].offsets.tolist()) for k in keys if k in ragged}
    tds = []
    for i in range(n):
        row = {p: t[i] for p, t in fixed.items()}
        row.update({p: v[o[i]:o[i + 1]] for p, (v, o) in values.items()})
        tds.append(TensorDict(row, batch_size=list(row_shape)))
    return lazy_stack(tds, 0)
