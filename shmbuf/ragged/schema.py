"""The ragged fields of a schema: which fields have a varying leading dimension, and
the record each row's values make (:mod:`shmbuf.core.arena`).

A field whose shape starts with ``None`` (its own length) or a string (a length shared
by every field that names it, checked at each write) is ragged; its other dimensions
are fixed. :func:`split` parts a user's schema into the fixed fields and the spec of
the ragged ones, which :func:`fields` reads back.

Examples:
    >>> import numpy as np
    >>> fixed, spec = split({"response": (("R",), np.int32), "logprobs": (("R",), np.float32),
    ...                      "prompt": ((None,), np.int32), "reward": ((), np.float32)})
    >>> list(fixed), [f.name for f in fields(spec)], dims(fields(spec))
    (['reward'], ['response', 'logprobs', 'prompt'], ['R', 'prompt'])
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
from numpy.lib import format as npformat

from shmbuf.core.schema import Field, dtype_from_json, normalize_fields

FIELD = "_record"
"""The hidden fixed field of a buffer with ragged fields: per row ``(lane, pos, length of
each dimension...)`` (int64), the row's record word."""


GROUP = "_group"
"""The hidden fixed field of a buffer with ragged fields: per row ``(i, n)``, its place in
the write that wrote it (row ``i`` of ``n``: a GRPO group written by one ``extend``)."""


@dataclass(frozen=True)
class Ragged:
    """A ragged field: ``name``, its dimension (``dim``: a shared name, or None for its
    own), the fixed ``trailing`` shape of each element and the ``dtype``."""

    name: str
    dim: str | None
    trailing: tuple[int, ...]
    dtype: np.dtype

    @property
    def key(self) -> str:
        """The name of its dimension: the shared one, or the field's own name."""
        return self.dim if self.dim is not None else self.name

    @property
    def element_bytes(self) -> int:
        return self.dtype.itemsize * math.prod(self.trailing)

    @property
    def shape(self) -> tuple[Any, ...]:
        """As the schema spells it: ``(None, *trailing)`` or ``(dim, *trailing)``."""
        return (self.dim, *self.trailing)


def is_ragged(spec: Any) -> bool:
    """Whether a schema entry ``(shape, dtype)`` has a ragged leading dimension."""
    return isinstance(spec, (tuple, list)) and len(spec) == 2 and isinstance(spec[0], (tuple, list)) \
        and len(spec[0]) > 0 and (spec[0][0] is None or isinstance(spec[0][0], str))


def split(given: Mapping[str, Any]) -> tuple[Any, dict | None]:
    """``given`` (a user's schema) as its fixed fields and the spec of its ragged ones
    (None if it has none). Each ragged field is checked as a fixed one would be (its
    trailing shape and dtype)."""
    if not isinstance(given, Mapping) or not any(is_ragged(v) for v in given.values()):
        return given, None
    fixed = {k: v for k, v in given.items() if not is_ragged(v)}
    out = []
    for name, (shape, dtype) in ((k, v) for k, v in given.items() if is_ragged(v)):
        dim = shape[0]
        if isinstance(dim, str) and not dim:
            raise ValueError(f"field {name!r}: a named length must be a non-empty string, got ''")
        if any(d is None or isinstance(d, str) for d in shape[1:]):
            raise ValueError(f"field {name!r}: only the first dimension may vary (None or a name), got {tuple(shape)}")
        (f,) = normalize_fields({name: (tuple(shape[1:]), dtype)})
        out.append({"name": name, "dim": dim, "shape": list(f.shape), "dtype": npformat.dtype_to_descr(f.dtype)})
    keys = {r["name"] for r in out}
    clash = sorted(k for k in {r["dim"] for r in out if r["dim"] is not None} if k in keys and
                   next(r for r in out if r["name"] == k)["dim"] != k)
    if clash:
        raise ValueError(f"the length name {clash[0]!r} is also the name of a ragged field of another length; rename one")
    return fixed, {"fields": out}


def fields(spec: Mapping[str, Any]) -> list[Ragged]:
    """The ragged fields of a spec (:func:`split`'s), checked (``ValueError``/``TypeError``
    for anything it does not make)."""
    got = []
    for r in spec["fields"]:
        if set(r) != {"name", "dim", "shape", "dtype"} or not isinstance(r["name"], str) \
                or not (r["dim"] is None or (isinstance(r["dim"], str) and r["dim"])):
            raise ValueError(f"{r!r:.200} is not a ragged field's spec")
        (f,) = normalize_fields({r["name"]: (tuple(r["shape"]), dtype_from_json(r["dtype"]))})
        got.append(Ragged(r["name"], r["dim"], f.shape, f.dtype))
    if not got or len({r.name for r in got}) != len(got):
        raise ValueError("a ragged spec names each of its fields once, and at least one")
    return got


def dims(ragged: list[Ragged]) -> list[str]:
    """The dimensions of ``ragged``, in the order their fields come (the lengths of a
    record word)."""
    return list(dict.fromkeys(r.key for r in ragged))


def as_field(r: Ragged) -> Field:
    """A fixed field of one element of ``r`` (for the checks of values: casts)."""
    return Field(r.name, r.trailing, r.dtype)
