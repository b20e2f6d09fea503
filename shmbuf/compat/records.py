"""An ``infos`` value of any size as one record (a ragged ``uint8`` row): the layout a
``ReplayBuffer`` of the imitation facade keeps (see :mod:`shmbuf.compat.infos` for both
layouts, the check and the damage rules they share).

Examples:
    >>> import numpy as np
    >>> record, left = pack({"ep": {"r": 1.5}, "obs": np.zeros((2, 3), np.float32), "note": None})
    >>> left, len(record) < 200
    ([], True)
    >>> got = unpack(record)
    >>> got["ep"], got["obs"].dtype, got["note"]
    ({'r': 1.5}, dtype('float32'), None)
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import numpy as np

from shmbuf.compat.infos import CHECK, checks, compact, damaged

HEAD = 4  # bytes: a record's header length (little-endian), before its JSON header
DEPTH = 32  # containers (dicts, lists, tuples, object arrays) a value may nest, at most
ARRAY_KINDS = "biufcUSmM"  # numpy dtypes a record holds (not objects, records or void)
_SCALARS = {"F": ("<f8", 8), "I": ("<i8", 8), "B": ("|u1", 1), "C": ("<c16", 16)}  # Python's float, int, bool, complex
_DTYPE_ANY = re.compile(r"[<>|][biufcUSmM][0-9]{1,9}(\[[0-9]{0,9}[a-zA-Z]{1,3}\])?")
_HEX = re.compile(r"-?0x[0-9a-f]+")
_layouts: dict[bytes, Any] = {}  # records' headers already parsed: (leaves, size, builder)


class _Unkept(Exception):
    """A value a record cannot hold without pickle (its dict's key is left out)."""


def pack(info: Any) -> tuple[bytes, list[str]]:
    """``info`` as one record's bytes (``b""`` for an empty dict) and the key paths it left
    out: a ``HEAD``-byte length, a JSON header (the value's structure: types, dtypes,
    shapes, keys), the values' bytes, then an 8-byte :func:`checks` of all of those.

    Kept exactly, with their types: dicts (keys of ``str``, ``int``, ``float``, ``bool``,
    ``None`` or tuples of them), lists, tuples, ``None``, Python's ``bool``, ``int``,
    ``float``, ``complex``, ``str``, ``bytes``, numpy arrays and scalars (dtypes of kind
    b, i, u, f, c, U, S, m, M), object arrays of such, nested up to ``DEPTH`` containers.
    Anything else (an object of another class: what only pickle could keep) is left out
    with its key.

    Examples:
        >>> import numpy as np
        >>> record, left = pack({"a": 1.5, "b": [None, np.arange(2)], "f": open})
        >>> left
        ['f']
        >>> got = unpack(record)
        >>> got["a"], got["b"][0], got["b"][1].tolist()
        (1.5, None, [0, 1])
        >>> pack({})
        (b'', [])
    """
    if type(info) is dict and not info:
        return b"", []
    left: list[str] = []
    blobs: list[bytes] = []
    try:
        node = _node(info, (), blobs, left, 0)
    except _Unkept:
        return b"", [type(info).__name__]
    if node == ["d"]:  # (every key left out: an empty dict)
        return b"", left
    header = compact(node).encode()
    body = len(header).to_bytes(HEAD, "little") + header + b"".join(blobs)
    check = checks(np.frombuffer(body, np.uint8)[None])
    return body + check.astype("<u8").tobytes(), left


def _key(k: Any, depth: int) -> Any:
    if type(k) is str:
        return k
    if k is None:
        return None
    if type(k) is bool:
        return ["b", k]
    if type(k) is int:
        return ["i", k]
    if type(k) is float:
        return ["f", k]
    if type(k) is tuple and depth < DEPTH:
        return ["t"] + [_key(x, depth + 1) for x in k]
    raise _Unkept


def _node(v: Any, path: tuple, blobs: list[bytes], left: list[str], depth: int) -> Any:
    """``v``'s header node; its values' bytes appended to ``blobs`` (depth-first, the
    order the header names them in)."""
    if v is None:
        return None
    t = type(v)
    if t is bool:
        blobs.append(b"\1" if v else b"\0")
        return "B"
    if isinstance(v, np.generic):
        if v.dtype.kind not in ARRAY_KINDS or v.dtype.itemsize == 0:
            raise _Unkept
        blobs.append(v.tobytes())
        return ["g", v.dtype.str]
    if t is np.ndarray:
        if v.dtype.kind == "O":
            if depth >= DEPTH:
                raise _Unkept
            return ["o", list(v.shape)] + [_node(x, path, blobs, left, depth + 1) for x in v.ravel().tolist()]
        if v.dtype.kind not in ARRAY_KINDS or v.dtype.itemsize == 0 or v.dtype.fields is not None:
            raise _Unkept
        blobs.append(np.ascontiguousarray(v).tobytes())
        return ["a", v.dtype.str, list(v.shape)]
    if isinstance(v, int) and not isinstance(v, bool):
        if -(1 << 63) <= v < (1 << 63):
            blobs.append(int(v).to_bytes(8, "little", signed=True))
            return "I"
        return ["L", hex(int(v))]
    if isinstance(v, float):
        blobs.append(np.float64(v).tobytes())
        return "F"
    if isinstance(v, complex):
        blobs.append(np.complex128(v).tobytes())
        return "C"
    if isinstance(v, str):
        b = str(v).encode("utf-8", "surrogatepass")
        blobs.append(b)
        return ["s", len(b)]
    if isinstance(v, bytes):
        blobs.append(bytes(v))
        return ["y", len(v)]
    if depth >= DEPTH:
        raise _Unkept
    if isinstance(v, dict):
        node: list = ["d"]
        for k, x in v.items():
            mark, marked = len(blobs), len(left)
            try:
                key = _key(k, depth)
                node += [key, _node(x, path + (k,), blobs, left, depth + 1)]
            except _Unkept:
                del blobs[mark:], left[marked:]
                left.append("/".join(map(str, path + (k,))))
        return node
    if isinstance(v, (list, tuple)):
        return ["l" if isinstance(v, list) else "t"] + [_node(x, path, blobs, left, depth + 1) for x in v]
    raise _Unkept


def unpack(record: Any) -> Any:
    """The value :func:`pack` wrote into ``record`` (bytes, or ``uint8`` values; ``{}``
    for none)."""
    values = np.frombuffer(bytes(record), np.uint8).copy() if not isinstance(record, np.ndarray) else record
    return unpack_rows(values, np.array([0, len(values)], np.int64))[0]


def unpack_rows(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """An object array of the values of the records ``values[offsets[i]:offsets[i + 1]]``
    (a :class:`~shmbuf.ragged.jagged.Jagged`'s ``values`` and ``offsets``): records of one
    header (the usual case) are read together, one column per value. A damaged record is
    a ``ValueError`` that says so, never another value: the check covers every byte, and
    the header is read strictly (only what :func:`pack` writes passes) before anything is
    built."""
    offsets = np.asarray(offsets, np.int64)
    n = len(offsets) - 1
    out = np.empty(n, dtype=object)
    lengths = np.diff(offsets)
    empty = lengths == 0
    if empty.any():
        k = int(np.count_nonzero(empty))
        out[np.flatnonzero(empty)] = np.fromiter(({} for _ in range(k)), object, k)
    if empty.all():
        return out
    if (lengths[~empty] < HEAD + 2 + CHECK).any():
        raise damaged(f"a record of {int(lengths[~empty].min())} bytes is shorter than any pack writes")
    kinds = np.unique(lengths[~empty])
    for length in kinds.tolist():
        idx = np.flatnonzero(lengths == length) if len(kinds) > 1 or empty.any() else np.arange(n)
        if len(idx) == n:  # (the usual case: every record of one length, end to end)
            rows = values[offsets[0]:offsets[-1]].reshape(n, length)
        elif len(idx) * length <= 1 << 22:
            rows = values[offsets[idx][:, None] + np.arange(length)]
        else:
            rows = np.stack([values[s:s + length] for s in offsets[idx].tolist()])
        heads = rows[:, 0].astype(np.int64) | rows[:, 1].astype(np.int64) << 8 \
            | rows[:, 2].astype(np.int64) << 16 | rows[:, 3].astype(np.int64) << 24
        if (HEAD + heads + CHECK > length).any():
            raise damaged(f"its header would have {int(heads.max())} bytes, more than its {length} hold")
        first = int(heads[0])
        same = (rows[:, :HEAD + first] == rows[0, :HEAD + first]).all(axis=1)
        groups: dict[bytes, Any] = {rows[0, HEAD:HEAD + first].tobytes(): np.flatnonzero(same)}
        for i in np.flatnonzero(~same).tolist():
            groups.setdefault(rows[i, HEAD:HEAD + int(heads[i])].tobytes(), []).append(i)
        for key, at in groups.items():
            part = rows if len(at) == len(rows) else rows[np.asarray(at)]
            out[idx[np.asarray(at)]] = _unpack_group(key, part)
    return out


def _unpack_group(key: bytes, rows: np.ndarray) -> np.ndarray:
    """The values of ``rows`` (``(m, L)`` records of the header ``key``)."""
    m, length = rows.shape
    leaves, size, build = _layout(key, length)
    end = HEAD + len(key) + size
    if end + CHECK != length:
        raise damaged(f"its header names {size} bytes of values, and its {length} bytes hold "
                       f"{length - HEAD - len(key) - CHECK}")
    stored = np.ascontiguousarray(rows[:, end:]).view("<u8").ravel()
    if (stored != checks(rows[:, :end])).any():
        raise damaged("its check does not match its bytes")
    at, columns = HEAD + len(key), []
    for kind, dtype, shape, nbytes in leaves:
        col = np.ascontiguousarray(rows[:, at:at + nbytes])
        at += nbytes
        if kind in _SCALARS:
            columns.append((col[:, 0] != 0).tolist() if kind == "B" else col.view(dtype).ravel().tolist())
        elif kind == "s":
            try:
                columns.append([r.tobytes().decode("utf-8", "surrogatepass") for r in col])
            except UnicodeDecodeError:
                raise damaged("a string is not UTF-8") from None
        elif kind == "y":
            columns.append([r.tobytes() for r in col])
        elif kind == "g":
            columns.append(list(col.view(dtype).reshape(m)))
        elif shape == ():  # ("a": an array of no dimensions stays one)
            columns.append([a.reshape(()) for a in col.view(dtype).reshape(m, 1)])
        else:
            columns.append(list(col.view(dtype).reshape((m,) + shape)))
    if not leaves:
        return np.fromiter((build() for _ in range(m)), object, m)
    return np.fromiter(map(build, *columns), object, m)


def _layout(key: bytes, length: int) -> tuple[list, int, Any]:
    """A record header's leaves ``(kind, dtype, shape, bytes)`` in order, their bytes in
    all, and the function of their values that builds the record's value: parsed once,
    strictly (nothing but what :func:`pack` writes passes)."""
    made = _layouts.get(key)
    if made is not None:
        return made
    try:
        doc = json.loads(key)
    except (ValueError, RecursionError) as e:  # (UnicodeDecodeError is a ValueError)
        raise damaged(f"its header is not JSON: {e}"[:200]) from None
    leaves: list = []
    consts: list = []
    try:
        code = _parse(doc, leaves, consts, 0, length)
    except RecursionError:
        raise damaged("its header nests too deeply") from None
    size = sum(leaf[3] for leaf in leaves)
    if size > length:
        raise damaged("its values run past the record")
    names = {f"c{j}": c for j, c in enumerate(consts)}
    names["_objects"] = _objects
    args = ", ".join(f"v{j}" for j in range(len(leaves)))
    try:
        build = eval(f"lambda {args}: {code}", names)  # noqa: S307 (str keys: reprs; the rest: names)
        build(*([0] * len(leaves)))  # (no value a header's code could not build from)
    except (TypeError, SyntaxError, RecursionError, MemoryError, ValueError) as e:
        raise damaged(f"its header cannot be read: {e}"[:200]) from None
    made = (leaves, size, build)
    if len(_layouts) < 4096:
        _layouts[key] = made
    return made


def _objects(shape: tuple, items: list) -> np.ndarray:
    a = np.empty(len(items), dtype=object)
    for i, x in enumerate(items):
        a[i] = x
    return a.reshape(shape)


def _parse(node: Any, leaves: list, consts: list, depth: int, length: int) -> str:
    """``node``'s Python expression (its values named ``v<j>``, its constants ``c<j>``),
    its leaves appended to ``leaves``; :func:`~shmbuf.compat.infos.damaged` for anything pack never writes."""
    if node is None:
        return "None"
    if type(node) is str:
        if node not in _SCALARS:
            raise damaged(f"a value's type is not one a record holds: {node!r:.50}")
        dtype, nbytes = _SCALARS[node]
        leaves.append((node, np.dtype(dtype), (), nbytes))
        return f"v{len(leaves) - 1}"
    if not (type(node) is list and node and type(node[0]) is str):
        raise damaged(f"a header node is not [tag, ...]: {node!r:.100}")
    tag, rest = node[0], node[1:]
    if tag in ("a", "g"):
        if len(rest) != (2 if tag == "a" else 1) or not (type(rest[0]) is str and _DTYPE_ANY.fullmatch(rest[0])):
            raise damaged(f"an array node is not one pack writes: {node!r:.100}")
        try:
            d = np.dtype(rest[0])
        except (TypeError, ValueError, SyntaxError):
            d = None
        if d is None or d.str != rest[0] or d.itemsize == 0:
            raise damaged(f"a dtype is not one a record holds: {rest[0]!r:.100}")
        shape = tuple(_shape(rest[1], length)) if tag == "a" else ()
        leaves.append((tag, d, shape, d.itemsize * math.prod(shape)))
        if leaves[-1][3] > length:
            raise damaged("its values run past the record")
        return f"v{len(leaves) - 1}"
    if tag in ("s", "y"):
        if len(rest) != 1 or type(rest[0]) is not int or not 0 <= rest[0] <= length:
            raise damaged(f"a string node is not one pack writes: {node!r:.100}")
        leaves.append((tag, None, (), rest[0]))
        return f"v{len(leaves) - 1}"
    if tag == "L":
        if len(rest) != 1 or type(rest[0]) is not str or not _HEX.fullmatch(rest[0]) or len(rest[0]) > length:
            raise damaged(f"an integer node is not one pack writes: {node!r:.100}")
        consts.append(int(rest[0], 16))
        return f"c{len(consts) - 1}"
    if depth >= DEPTH:
        raise damaged(f"its header nests more than {DEPTH} containers")
    if tag in ("l", "t"):
        items = [_parse(x, leaves, consts, depth + 1, length) for x in rest]
        return "[" + ", ".join(items) + "]" if tag == "l" else "(" + "".join(x + ", " for x in items) + ")"
    if tag == "o":
        shape = _shape(rest[0] if rest else None, length)
        if len(rest) - 1 != math.prod(shape):
            raise damaged("an object array's header holds another number of items than its shape")
        items = [_parse(x, leaves, consts, depth + 1, length) for x in rest[1:]]
        return f"_objects({tuple(shape)!r}, [" + ", ".join(items) + "])"
    if tag == "d":
        if len(rest) % 2:
            raise damaged("a dict's header holds a key without a value")
        keys = [_key_of(k, 0) for k in rest[::2]]
        if len(set(map(_hashed, keys))) != len(keys):
            raise damaged("a dict's header names a key twice")
        parts = []
        for k, v in zip(keys, rest[1::2]):
            if type(k) is str:
                name = repr(k)
            else:
                consts.append(k)
                name = f"c{len(consts) - 1}"
            parts.append(f"{name}: {_parse(v, leaves, consts, depth + 1, length)}")
        return "{" + ", ".join(parts) + "}"
    raise damaged(f"a header node's tag is not one pack writes: {tag!r:.50}")


def _hashed(k: Any) -> Any:
    return ("nan",) if type(k) is float and k != k else k  # (two NaN keys: the same key twice)


def _shape(shape: Any, length: int) -> list[int]:
    if not (type(shape) is list and all(type(x) is int and 0 <= x <= length for x in shape)):
        raise damaged(f"a shape is not a list of ints >= 0: {shape!r:.100}")
    return shape


def _key_of(k: Any, depth: int) -> Any:
    if type(k) is str or k is None:
        return k
    if type(k) is list and len(k) >= 1 and k[0] == "t" and depth < DEPTH:
        return tuple(_key_of(x, depth + 1) for x in k[1:])
    if type(k) is list and len(k) == 2 and (k[0], type(k[1])) in (("b", bool), ("i", int), ("f", float)):
        return k[1]
    raise damaged(f"a key is not one pack writes: {k!r:.100}")
