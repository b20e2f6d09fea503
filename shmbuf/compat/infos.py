"""Per-row ``infos`` values in shared memory without pickle: two layouts.

**Records** (:mod:`shmbuf.compat.records`: ``pack``, ``unpack_rows``): what a
``ReplayBuffer`` of the imitation facade keeps, one record of any size per row (a ragged ``uint8`` field): a ``HEAD``-byte
length, a JSON header that spells the value's structure (dicts and their keys, lists,
tuples, ``None``, and for each leaf its type, dtype and shape), the leaves' bytes in the
header's order, then 8 bytes that check all of those (:func:`checks`); an empty dict is
no bytes at all. Kept exactly, types included: dicts (keys ``str``, ``int``, ``float``,
``bool``, ``None`` or tuples of them), lists, tuples, ``None``, Python's ``bool``,
``int`` (any size), ``float``, ``complex``, ``str``, ``bytes``, numpy arrays and scalars
(kinds b, i, u, f, c, U, S, m, M; object arrays of such), nested up to ``DEPTH``
containers. An object of any other class (what only pickle could keep) is left out
with its key: ``pack`` returns the keys it left out, and the caller warns.

**Fixed rows** (:func:`encode`, :func:`decode_rows`, here): the layout of ``ReplayBuffer``
segments an older shmbuf made (``info_bytes`` bytes of each row), still read and
written for them: a 2-byte length, a JSON header ``[[key path, dtype, shape], ...]``,
each value's raw bytes, then 8 bytes that check all of those, zeros after; an empty
dict is all zeros. Kept: ``str`` keys whose values are numbers, booleans, strings or
numpy arrays of them (kinds b, i, u, f, c, U), nested dicts of such (by key path);
anything else, and values past the row's size, are left out of that row
(:func:`encode` returns their keys).

A damaged row or record raises ``ValueError``, never anything else, and never decodes
into another value: the check covers every byte that decoding reads (a fixed row's
zeros after it are never read; an empty dict's row must be all zeros), and the header
is read strictly (only what the encoder writes passes) before anything is built.

Examples:
    >>> import numpy as np
    >>> row = np.zeros(128, np.uint8)
    >>> encode({"a": 1.5, "b": {"c": np.arange(2)}}, row)
    []
    >>> got = decode(row)
    >>> float(got["a"]), got["b"]["c"].tolist()
    (1.5, [0, 1])
    >>> row[45] ^= 1  # one bit of a value (of "a": bytes 42-49), or of anything decoding reads
    >>> decode(row)
    Traceback (most recent call last):
    ...
    ValueError: an infos row is damaged (its check does not match its bytes): it was not written by shmbuf's encode, or it was changed since
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Iterable

import numpy as np

KINDS = "biufcU"
CHECK = 8  # bytes: the check after a row's values (checks())
_DTYPE = re.compile(r"[<>|][biufcU][0-9]{1,9}")  # a dtype.str of KINDS (encode writes those)
_cache: dict[bytes, list] = {}  # headers already parsed (rows of one run share a few)
_builders: dict[bytes, Any] = {}  # ... and the function that builds their dicts


def compact(doc: Any) -> str:
    """``doc`` as compact JSON (no spaces: Monitor's and imitation's usual infos fit in
    the default 256 bytes of a row)."""
    return json.dumps(doc, separators=(",", ":"))


def damaged(why: str) -> ValueError:
    return ValueError(f"an infos row is damaged ({why}): it was not written by shmbuf's encode, "
                      "or it was changed since")


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
    entries, blobs, left, used = [], [], [], 2 + 1  # (the length, and the header's brackets less a comma)
    for path, value in _leaves(info, ()) if isinstance(info, dict) else ():
        a = np.asarray(value) if not isinstance(value, (dict, type(None))) else None
        name = "/".join(map(str, path))
        if a is None or a.dtype.kind not in KINDS or not all(isinstance(p, str) for p in path):
            left.append(name)
            continue
        entry = [list(path), a.dtype.str, list(a.shape)]
        size = len(compact(entry)) + 1 + a.nbytes  # (the entry, its comma, its bytes)
        if used + size > len(out) - CHECK:
            left.append(name)
            continue
        used += size
        entries.append(entry)
        blobs.append(np.ascontiguousarray(a).tobytes())
    if not isinstance(info, dict):
        left.append(type(info).__name__)
    if entries:
        header = compact(entries).encode()
        blob = np.frombuffer(len(header).to_bytes(2, "little") + header + b"".join(blobs), np.uint8)
        out[:len(blob)] = blob
        out[len(blob):len(blob) + CHECK] = checks(blob[None]).view(np.uint8)
    return left


def _entries(key: bytes, width: int) -> list:
    """A header's entries ``(path, dtype, shape, size)``, parsed once and checked
    strictly: nothing but what :func:`encode` writes passes."""
    entries = _cache.get(key)
    if entries is None:
        try:
            doc = json.loads(key)
        except (ValueError, RecursionError) as e:  # (UnicodeDecodeError is a ValueError)
            raise damaged(f"its header is not JSON: {e}"[:200]) from None
        if not isinstance(doc, list) or not doc:
            raise damaged("its header is not a list of entries")
        entries = []
        for entry in doc:
            if not (isinstance(entry, list) and len(entry) == 3):
                raise damaged(f"a header entry is not [key path, dtype, shape]: {entry!r:.100}")
            path, dtype, shape = entry
            if not (isinstance(path, list) and path and all(type(k) is str for k in path)):
                raise damaged(f"a key path is not a list of strings: {path!r:.100}")
            if not (type(dtype) is str and _DTYPE.fullmatch(dtype)):
                raise damaged(f"a dtype is not one infos holds: {dtype!r:.100}")
            if not (isinstance(shape, list) and all(type(x) is int and x >= 0 for x in shape)):
                raise damaged(f"a shape is not a list of ints >= 0: {shape!r:.100}")
            size = int(dtype[2:]) * (4 if dtype[1] == "U" else 1) * math.prod(shape)  # (exact: no overflow)
            if size > width:
                raise damaged("its values run past the row")
            try:
                d = np.dtype(dtype)
            except (TypeError, ValueError, SyntaxError):  # ("<f3": none; what numpy raises varies)
                d = None
            if d is None or d.str != dtype or d.itemsize == 0:
                raise damaged(f"a dtype is not one infos holds: {dtype!r:.100}")
            entries.append((tuple(path), d, tuple(shape), size))
        if len(_cache) < 4096:
            _cache[key] = entries
    if 2 + len(key) + sum(e[3] for e in entries) > width - CHECK:
        raise damaged("its values run past the row")
    return entries


def decode(row: np.ndarray) -> dict[str, Any]:
    """The dict :func:`encode` wrote into ``row`` (``{}`` for a row of zeros)."""
    return decode_rows(row[None])[0]


def decode_rows(rows: np.ndarray) -> np.ndarray:
    """An object array of the dicts of ``rows`` (``(n, info_bytes)`` ``uint8``): rows with
    the same header (the usual case) are read together, one column per key."""
    n_rows, width = rows.shape
    out = np.empty(n_rows, dtype=object)
    if width < 2 + CHECK:  # (encode writes nothing into such rows)
        if rows.any():
            raise damaged(f"a row of {width} bytes holds nothing but zeros")
        out[:] = [{} for _ in range(n_rows)]
        return out
    lengths = (rows[:, 0].astype(np.int64) | rows[:, 1].astype(np.int64) << 8)
    empty = lengths == 0
    if empty.any() and rows[empty].any():
        raise damaged("its length is 0, an empty dict's, but it holds more than zeros")
    if (2 + lengths + CHECK > width).any():
        raise damaged(f"its header would have {int(lengths.max())} bytes, more than the row's {width} hold")
    groups: dict[bytes, Any] = {}
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
        entries = _entries(key, width)
        end = 2 + len(key) + sum(e[3] for e in entries)  # (the check's place: after the values)
        part = rows[:, :end + CHECK] if len(idx) == n_rows else rows[idx, :end + CHECK]
        stored = np.ascontiguousarray(part[:, end:]).view("<u8").ravel()
        if (stored != checks(part[:, :end])).any():
            raise damaged("its check does not match its bytes")
        at, paths, values = 2 + len(key), [], []
        for path, dtype, shape, size in entries:
            col = np.ascontiguousarray(rows[idx, at:at + size]).view(dtype).reshape((len(idx),) + shape)
            paths.append(path)
            values.append(list(col))  # (numpy scalars, or arrays of the key's shape)
            at += size
        out[np.asarray(idx)] = np.fromiter(map(_builder(key, paths), *values), object, len(idx))
    return out


def _odd_constants(n: int, start: int = 0) -> np.ndarray:
    """``n`` odd 64-bit constants: splitmix64 from ``start`` (plain integer arithmetic, so
    every process and numpy version has the same ones)."""
    x = (np.arange(start + 1, start + n + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15))
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return (x ^ (x >> np.uint64(31))) | np.uint64(1)


_K = _odd_constants(1 << 14)  # one per 32-bit word of a block of 64 kB
_BLOCKS = [np.ones(1, np.uint64)]  # each block's factor (1 for the first: a row of 64 kB or less as before)


def _block_factors(n: int) -> np.ndarray:
    """``n`` factors, one per 64 kB block of a row: 1, then odd constants (splitmix64
    after ``_K``'s)."""
    if len(_BLOCKS[0]) < n:
        m = max(n, 2 * len(_BLOCKS[0]))
        _BLOCKS[0] = np.concatenate((np.ones(1, np.uint64), _odd_constants(m - 1, len(_K))))
    return _BLOCKS[0][:n]


def checks(rows: np.ndarray) -> np.ndarray:
    """The check of each row of bytes (``(n, m)`` ``uint8``): the sum of the row's 32-bit
    words (zeros after its end), each times its own odd constant, modulo 2**64, for all
    rows at once (a matrix product: a CRC-32 row by row took longer than the rest of a
    decode). A word's constant is ``_K``'s of its place in its 64 kB block times its
    block's odd factor (1 for the first block, so a row of 64 kB or less has the check
    it always had). A change within one word always changes it (an odd constant is
    invertible modulo 2**64); random damage of more words goes unseen with a chance of
    about 2**-64. Not a signature: a writer that forges a row can write any dict it likes."""
    n, m = rows.shape
    words = -(-m // 4)
    k = len(_K)
    blocks = max(1, -(-words // k))
    width = 4 * (words if blocks == 1 else blocks * k)
    if m != width:
        padded = np.zeros((n, width), np.uint8)
        padded[:, :m] = rows
    else:
        padded = np.ascontiguousarray(rows)
    w = padded.view("<u4").astype(np.uint64)
    if blocks == 1:
        return w @ _K[:words]
    return (w.reshape(n, blocks, k) @ _K) @ _block_factors(blocks)


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
                    raise damaged("its header names a key both as a value and as a dict")
            if path[-1] in node:
                raise damaged("its header names a key twice")
            node[path[-1]] = j

        def display(node: dict) -> str:
            return "{" + ", ".join(f"{k!r}: " + (display(v) if isinstance(v, dict) else f"v{v}")
                                   for k, v in node.items()) + "}"

        args = ", ".join(f"v{j}" for j in range(len(paths)))
        try:
            made = eval(f"lambda {args}: {display(tree)}", {})  # noqa: S307 (keys: str reprs; values: names)
            made(*range(len(paths)))
        except (TypeError, SyntaxError, RecursionError, MemoryError) as e:  # (a key both a value and a dict of them)
            raise damaged(f"its header cannot be read: {e}"[:200]) from None
        if len(_builders) < 4096:
            _builders[key] = made
    return made
