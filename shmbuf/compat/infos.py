"""Per-row ``infos`` dicts kept in a fixed number of bytes of a row (the imitation
facade's ``info_bytes=``): what a Python dict can be in shared memory without pickle.

A row's bytes: a 2-byte length, a JSON header ``[[key path, dtype, shape], ...]``, then
each value's raw bytes; an empty dict is all zeros. Kept: ``str`` keys whose values are
numbers, booleans, strings or numpy arrays of them (``numpy`` dtypes of kind b, i, u, f,
c, U), nested dicts of such (by key path). Anything else (``None``, lists of mixed types,
objects), and values past the row's size, are left out of that row: :func:`encode`
returns the keys it left out, and the caller warns. Decoding checks every header word
against the row's size and kinds, so a damaged row raises ``ValueError``, never more.
"""

from __future__ import annotations

import json
from typing import Any, Iterable

import numpy as np

KINDS = "biufcU"
_cache: dict[bytes, list] = {}  # headers already parsed (rows of one run share a few)
_builders: dict[bytes, Any] = {}  # ... and the function that builds their dicts


def _leaves(d: Any, path: tuple) -> Iterable[tuple[tuple, Any]]:
    for k, v in d.items():
        if isinstance(v, dict) and isinstance(k, str):
            yield from _leaves(v, path + (k,))
        else:
            yield path + (k,), v


def encode(info: Any, out: np.ndarray) -> list[str]:
    """Write ``info`` into ``out`` (a row's ``uint8`` bytes); returns the keys left out."""
    out[:] = 0
    if not info:
        return []
    entries, blobs, left, used = [], [], [], 2 + 2  # (the length, and the header's brackets)
    for path, value in _leaves(info, ()) if isinstance(info, dict) else ():
        a = np.asarray(value) if not isinstance(value, (dict, type(None))) else None
        name = "/".join(map(str, path))
        if a is None or a.dtype.kind not in KINDS or not all(isinstance(p, str) for p in path):
            left.append(name)
            continue
        entry = [list(path), a.dtype.str, list(a.shape)]
        size = len(json.dumps(entry)) + 2 + a.nbytes
        if used + size > len(out):
            left.append(name)
            continue
        used += size
        entries.append(entry)
        blobs.append(np.ascontiguousarray(a).tobytes())
    if not isinstance(info, dict):
        left.append(type(info).__name__)
    if entries:
        header = json.dumps(entries).encode()
        blob = len(header).to_bytes(2, "little") + header + b"".join(blobs)
        out[:len(blob)] = np.frombuffer(blob, np.uint8)
    return left


def _entries(key: bytes, width: int) -> list:
    """A header's entries ``(path, dtype, shape, size)``, parsed once and checked."""
    entries = _cache.get(key)
    if entries is None:
        try:
            parsed = [(tuple(p), np.dtype(d), tuple(int(x) for x in s)) for p, d, s in json.loads(key)]
        except (ValueError, TypeError) as e:
            raise ValueError(f"an infos row's header cannot be read: {e}") from None
        if any(d.kind not in KINDS or any(x < 0 for x in s) or not p or not all(isinstance(k, str) for k in p)
               for p, d, s in parsed):
            raise ValueError("an infos row's header names a dtype or shape infos cannot hold")
        entries = [(p, d, s, d.itemsize * int(np.prod(s, dtype=np.int64))) for p, d, s in parsed]
        if len(_cache) < 4096:
            _cache[key] = entries
    if 2 + len(key) + sum(e[3] for e in entries) > width:
        raise ValueError("an infos row's values run past the row")
    return entries


def decode(row: np.ndarray) -> dict[str, Any]:
    """The dict :func:`encode` wrote into ``row`` (``{}`` for a row of zeros)."""
    return decode_rows(row[None])[0]


def decode_rows(rows: np.ndarray) -> np.ndarray:
    """An object array of the dicts of ``rows`` (``(n, info_bytes)`` ``uint8``): rows with
    the same header (the usual case) are read together, one column per key."""
    n_rows, width = rows.shape
    out = np.empty(n_rows, dtype=object)
    lengths = (rows[:, 0].astype(np.int64) | rows[:, 1].astype(np.int64) << 8) if width >= 2 else np.zeros(n_rows, int)
    if (2 + lengths > width).any():
        raise ValueError(f"an infos row says its header has {int(lengths.max())} bytes, more than the row's {width}")
    groups: dict[bytes, Any] = {}
    empty = lengths == 0
    if empty.any():
        k = int(np.count_nonzero(empty))
        out[np.flatnonzero(empty)] = np.fromiter(({} for _ in range(k)), object, k)
    if not empty.all():  # (the usual case: the rows share one header, found in one comparison)
        first = int(np.argmin(empty))
        n = int(lengths[first])
        same = (rows[:, :2 + n] == rows[first, :2 + n]).all(axis=1)
        groups[rows[first, 2:2 + n].tobytes()] = np.flatnonzero(same)
        for i in np.flatnonzero(~same & ~empty).tolist():
            groups.setdefault(rows[i, 2:2 + int(lengths[i])].tobytes(), []).append(i)
    for key, idx in groups.items():
        at, paths, values = 2 + len(key), [], []
        for path, dtype, shape, size in _entries(key, width):
            col = np.ascontiguousarray(rows[idx, at:at + size]).view(dtype).reshape((len(idx),) + shape)
            paths.append(path)
            values.append(list(col))  # (numpy scalars, or arrays of the key's shape)
            at += size
        out[np.asarray(idx)] = np.fromiter(map(_builder(key, paths), *values), object, len(idx))
    return out


def _builder(key: bytes, paths: list[tuple]) -> Any:
    """A function of a row's values (in ``paths``' order) that returns its nested dict:
    a dict display per level, made once per header (keys are strings: their ``repr`` is
    a literal)."""
    made = _builders.get(key)
    if made is None:
        tree: dict = {}
        for j, path in enumerate(paths):
            node = tree
            for p in path[:-1]:
                node = node.setdefault(p, {})
                if not isinstance(node, dict):
                    raise ValueError("an infos row's header names a key both as a value and as a dict")
            if path[-1] in node:
                raise ValueError("an infos row's header names a key twice")
            node[path[-1]] = j

        def display(node: dict) -> str:
            return "{" + ", ".join(f"{k!r}: " + (display(v) if isinstance(v, dict) else f"v{v}")
                                   for k, v in node.items()) + "}"

        args = ", ".join(f"v{j}" for j in range(len(paths)))
        try:
            made = eval(f"lambda {args}: {display(tree)}", {})  # noqa: S307 (keys: str reprs; values: names)
            made(*range(len(paths)))
        except (TypeError, SyntaxError, RecursionError) as e:  # (a key both a value and a dict of them)
            raise ValueError(f"an infos row's header cannot be read: {e}") from None
        if len(_builders) < 4096:
            _builders[key] = made
    return made
