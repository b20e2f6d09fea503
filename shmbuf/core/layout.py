"""Where everything lives inside a segment: header, schema, control tables, fields.

A segment is self-describing, so ``attach(name)`` needs nothing else::

    offset 0     fixed header (256 bytes, little-endian, see ``_HEADER``)
                 magic, format version, logical size, capacity, lanes, offsets
    256          schema: UTF-8 JSON {"fields": [{name, dtype, shape, offset, stride}], "meta": {...},
                 "regions": {name: [offset, bytes]}}
    aligned      control   (16 int64)      lock-holder pid (diagnostics), spare words
    aligned      lanes     (lanes x 8)     head, base, claim pid, claim start time, spare
    aligned      reservations (R x 8)      in-flight writes: pid, start time, lane, start, count, token
    aligned      rows      (capacity x S)  per slot: its int64 stamp (see ring.py), then the
                                           small fields, packed
    aligned      one array per large field (capacity, *shape), C order
    aligned      regions   named blocks of bytes the layers above keep beside the rows
                           (shmbuf.priority.trees's trees), listed in the schema

**Packed rows.** Fields of at most :data:`PACK_LIMIT` bytes a row live together in
one row of the rows block, right after the slot's stamp (largest alignment first, so
every value is naturally aligned; ``S``, the row stride, is a multiple of 8): reading a
row touches one 4 kB page and a few cache lines, and the stamp that guards it is in the
same line. Larger fields (image frames) keep an array of their own. A field's schema
entry gives its ``offset`` (of row 0) and its ``stride`` (bytes from one row to the
next).

**Metadata.** The schema's ``meta`` is the library's: the specs of the buffer's parts
under ``"parts"`` (:mod:`shmbuf.parts`: ``{"queue": {}, "priority": {"alpha": 0.6},
"sampler": {"name": "newest", "options": {}}, ...}``), and what the layers built on
Buffer describe themselves with (an episode buffer's observation fields, a facade's
kind). The user's ``meta=`` (``Buffer.create``'s) lives apart, under the one reserved
key :data:`USER`, returned exactly as given and never read by the library. Older
segments still attach: version 5 kept the capabilities' settings as keys of ``meta``
itself (read once by :func:`shmbuf.parts.legacy`), version 4 besides kept one flat
object, the user's keys and the library's mixed (a user's ``{"sampler": "newest"}``
switched the sampler; read once by :func:`from_flat`).

Every block starts on a 64-byte boundary (a cache line). The tables' spare words keep
room for later features without moving the existing ones; any change of meaning bumps
``VERSION``.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np
from numpy.lib import format as npformat

from shmbuf.core.schema import MAX_DIMS, Field, as_count, dtype_from_json, normalize_fields  # noqa: F401
from shmbuf.core.segment import FormatError, NotReadyError

MAGIC = b"\x93SHMBUF\x01"
VERSION = 6
SETTINGS_META_VERSION = 5
"""The last version whose ``meta`` kept the capabilities' settings as keys of its own
(read by :func:`shmbuf.parts.legacy`), not as the parts' specs under ``"parts"``."""
FLAT_META_VERSION = 4
"""The last version whose schema kept the user's metadata and the library's in one
object (read by :func:`from_flat`); everything else in it is as in :data:`VERSION`."""
USER = "user"
"""The key of a layout's ``meta`` that holds the user's ``meta=``; every other key is the
library's."""
ALIGN = 64
PACK_LIMIT = 1024
"""Fields of at most this many bytes per row are packed into the rows block."""
HEADER_SIZE = 256
N_RESERVATIONS = 256

# magic, version, flags, total, capacity, lanes, lane_capacity, schema_off, schema_len,
# control_off, lanes_off, res_off, n_res, rows_off, row_stride, creator_pid, creator_ctime,
# created_at
_HEADER = struct.Struct("<8sII Q QQQ QQ QQQQ QQ q d d")

FLAG_PERSIST = 1

# Column indices of the int64 tables.
LANE_HEAD, LANE_BASE, LANE_CLAIM_PID, LANE_CLAIM_CTIME = 0, 1, 2, 3
LANE_OWN_START, LANE_OWN_COUNT = 4, 5  # the write in flight of the lane's owner (count 0: none)
LANE_EPISODES = 6  # the number of the lane's newest episode (shmbuf.episodes numbers them)
LANE_FLUSHED = 7  # a buffer file's: rows below it were on the disk at the last flush (core/durable.py)
RES_PID, RES_CTIME, RES_LANE, RES_START, RES_COUNT, RES_TOKEN = 0, 1, 2, 3, 4, 5
CTRL_LOCK_HOLDER = 0
CTRL_SAMPLED = 1  # items ever sampled (counted only under a rate limit: shmbuf.rate.limit)
CTRL_BOOT, CTRL_FLUSHES, CTRL_FLUSHED_AT = 2, 3, 4  # a buffer file's: see shmbuf.core.durable
CTRL_YIELD, CTRL_NO_YIELD = 5, 6  # writers wait for a learner's gather until then; 1: never (core/yielding.py)
TABLE_WIDTH = 8  # int64 words per row of the lane and reservation tables (one cache line)
CONTROL_WORDS = 16




def published(seq: Any) -> Any:
    """The stamp of a slot that holds row ``seq`` published (complete and unchanged
    since): ``2*seq + 2`` (see :mod:`shmbuf.core.ring`; ``2*seq + 1``: being written)."""
    return 2 * seq + 2


def c_strides(f: Any) -> tuple[int, ...]:
    """Strides of one C-ordered row of field ``f``."""
    strides, step = [], f.dtype.itemsize
    for dim in reversed(f.shape):
        strides.append(step)
        step *= dim
    return tuple(reversed(strides))


MAX_RESERVATIONS = 1 << 16
MAX_SEQ = (1 << 62) - 1
"""The largest head a lane may reach (a row a nanosecond for 146 years): every stamp
``2*s + 2`` then fits an int64. Table words beyond it are refused at attach, and a
write that would pass it is refused, so no arithmetic on them overflows."""


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


@dataclass(frozen=True)
class Layout:
    """The positions of everything in a segment. Build with :meth:`plan` or :meth:`read`."""

    fields: tuple[Field, ...]
    capacity: int
    lanes: int
    flags: int
    total_size: int
    schema_offset: int
    schema_size: int
    control_offset: int
    lanes_offset: int
    reservations_offset: int
    n_reservations: int
    rows_offset: int
    row_stride: int
    creator_pid: int = 0
    creator_ctime: float = 0.0
    created_at: float = 0.0
    meta: Mapping[str, Any] = field(default_factory=dict)  # what layers above store (JSON)
    regions: Mapping[str, tuple[int, int]] = field(default_factory=dict)  # name: (offset, bytes)

    @property
    def lane_capacity(self) -> int:
        return self.capacity // self.lanes

    @property
    def row_bytes(self) -> int:
        return sum(f.row_bytes for f in self.fields)

    def stored(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """``{name: (shape, dtype)}`` of every stored field, hidden ones included."""
        return {f.name: (f.shape, f.dtype) for f in self.fields}

    @classmethod
    def plan(cls, fields: Mapping[str, Any], capacity: int, lanes: int = 1, flags: int = 0,
             creator: tuple[int, float] = (0, 0.0), created_at: float = 0.0,
             meta: Mapping[str, Any] | None = None, regions: Mapping[str, int] | None = None) -> "Layout":
        """Lay out a new buffer; validates the schema, capacity and lanes. ``meta``: a
        JSON object that the layers above Buffer keep with the schema (an episode
        buffer's observation fields, say; ``"parts"`` and :data:`USER` are ``{}`` unless
        given). ``regions``: ``{name: bytes}`` of blocks for them (zeros when created)."""
        specs = normalize_fields(fields)
        meta = {"parts": {}, USER: {}, **check_meta(meta)}
        regions = dict(regions or {})
        for key, size in regions.items():
            if not isinstance(key, str) or not key or as_count(size, f"region {key!r}: size") > 1 << 50:
                raise ValueError(f"bad region {key!r}: {size!r} bytes")
        capacity = as_count(capacity, "capacity")
        lanes = as_count(lanes, "lanes")
        if capacity < lanes:
            raise ValueError(f"capacity ({capacity}) must be at least lanes ({lanes}): each lane "
                             f"holds capacity // lanes rows; use capacity={lanes} or more")
        if capacity % lanes:
            lo, hi = capacity - capacity % lanes, capacity + lanes - capacity % lanes
            raise ValueError(
                f"capacity ({capacity}) must be a multiple of lanes ({lanes}), since each lane "
                f"holds capacity // lanes rows: use capacity={lo} or {hi}"
            )
        # The schema's own size depends on the offsets it lists; offsets depend on the
        # schema size. Reserve generously (offsets are at most 20 digits), then fix.
        draft = _schema_bytes([Field(f.name, f.shape, f.dtype, 10**19, 10**19) for f in specs], meta,
                              {k: (10**19, 10**19) for k in regions})
        schema_size = len(draft)
        pos = _align(HEADER_SIZE + schema_size)
        control = pos
        pos = _align(pos + CONTROL_WORDS * 8)
        lanes_off = pos
        pos = _align(pos + lanes * TABLE_WIDTH * 8)
        res_off = pos
        pos = _align(pos + N_RESERVATIONS * TABLE_WIDTH * 8)
        rows = pos
        small = sorted((f for f in specs if f.row_bytes <= PACK_LIMIT),
                       key=lambda f: -f.dtype.alignment)  # stable: schema order otherwise
        at = {}
        stride = 8  # the stamp
        for f in small:
            stride = -(-stride // f.dtype.alignment) * f.dtype.alignment
            at[f.name] = stride
            stride += f.row_bytes
        stride = -(-stride // 8) * 8
        pos = _align(pos + capacity * stride)
        placed = []
        for f in specs:
            if f.name in at:
                placed.append(Field(f.name, f.shape, f.dtype, rows + at[f.name], stride))
            else:
                placed.append(Field(f.name, f.shape, f.dtype, pos, f.row_bytes))
                pos = _align(pos + capacity * f.row_bytes)
        at_region = {}
        for key, size in regions.items():
            at_region[key] = (pos, int(size))
            pos = _align(pos + size)
        return cls(tuple(placed), capacity, lanes, flags, pos, HEADER_SIZE, schema_size,
                   control, lanes_off, res_off, N_RESERVATIONS, rows, stride,
                   creator[0], creator[1], created_at, meta, at_region)

    def write(self, mem: Any) -> None:
        """Write header and schema; the magic goes last, so a half-made header never validates."""
        schema = _schema_bytes(self.fields, self.meta, self.regions).ljust(self.schema_size, b" ")
        mem[self.schema_offset:self.schema_offset + self.schema_size] = schema
        _HEADER.pack_into(
            mem, 0, b"\0" * 8, VERSION, self.flags, self.total_size, self.capacity,
            self.lanes, self.lane_capacity, self.schema_offset, self.schema_size,
            self.control_offset, self.lanes_offset, self.reservations_offset,
            self.n_reservations, self.rows_offset, self.row_stride, self.creator_pid, self.creator_ctime,
            self.created_at)
        mem[0:8] = MAGIC

    @classmethod
    def read(cls, mem: Any, name: str) -> "Layout":
        """Parse and validate a segment's header and schema; never reads outside ``mem``.

        Everything in a segment is untrusted (another program, a bug or an attacker may
        have written it): every problem is a :class:`FormatError`, and a layout that
        passes cannot make later array views overlap, leave the segment, hold Python
        objects or break numpy's limits.
        """
        def bad(why: str) -> FormatError:
            return FormatError(f"shared-memory segment {name!r} is not a usable shmbuf buffer: {why}")

        size = len(mem)
        if size < HEADER_SIZE:
            raise bad(f"it is {size} bytes, smaller than a header ({HEADER_SIZE})")
        (magic, version, flags, total, capacity, lanes, lane_cap, schema_off, schema_size,
         control, lanes_off, res_off, n_res, rows, stride, pid, ctime, created_at) = \
            _HEADER.unpack_from(mem, 0)
        if magic != MAGIC:
            if magic == b"\0" * 8:
                raise NotReadyError(
                    f"shared-memory segment {name!r} is not ready: its header is not written "
                    "(it is still being created, or its creator died while creating it)")
            raise bad(f"bad magic {magic!r}")
        if version not in (VERSION, SETTINGS_META_VERSION, FLAT_META_VERSION):
            raise bad(f"format version {version}, but this shmbuf reads versions {FLAT_META_VERSION} to "
                      f"{VERSION}; use the shmbuf release that created it")
        if flags & ~FLAG_PERSIST:
            raise bad(f"unknown flags {flags:#x}")
        if total > size:
            raise bad(f"truncated: the header says {total} bytes, the segment has {size}")
        if not (capacity >= 1 and lanes >= 1 and capacity % lanes == 0
                and lane_cap == capacity // lanes):
            raise bad(f"inconsistent capacity {capacity} / lanes {lanes} / lane capacity {lane_cap}")
        if not 1 <= n_res <= MAX_RESERVATIONS:
            raise bad(f"{n_res} reservation entries (expected 1 to {MAX_RESERVATIONS})")
        if pid < 0 or not (math.isfinite(ctime) and math.isfinite(created_at)):
            raise bad(f"bad creator fields (pid {pid}, start time {ctime}, created {created_at})")
        if schema_off < HEADER_SIZE or schema_off + schema_size > total:
            raise bad(f"the schema lies outside the segment ({schema_off} + {schema_size})")
        try:
            fields, meta, regions = _parse_schema(bytes(mem[schema_off:schema_off + schema_size]))
        except FormatError as exc:
            raise bad(str(exc)) from None
        if version == FLAT_META_VERSION:
            meta = from_flat(meta)
            meta.pop("parts", None)  # (a user's key: its settings are read as version 5's)
        elif not isinstance(meta.get(USER), dict):
            raise bad(f"the schema's meta has no object under {USER!r} (the user's metadata)")
        if (version == VERSION) != isinstance(meta.get("parts"), dict):
            raise bad("the schema's meta has no object under 'parts' (the specs of the buffer's parts)"
                      if version == VERSION else f"the schema's meta of version {version} has a key 'parts'")
        blocks = [("schema", schema_off, schema_size), ("control table", control, CONTROL_WORDS * 8),
                  ("lane table", lanes_off, lanes * TABLE_WIDTH * 8),
                  ("reservation table", res_off, n_res * TABLE_WIDTH * 8),
                  ("rows", rows, capacity * stride)]
        if not 8 <= stride <= 8 + len(fields) * (PACK_LIMIT + 16) or stride % 8:
            raise bad(f"row stride {stride} is not a multiple of 8 in [8, {8 + len(fields) * (PACK_LIMIT + 16)}]")
        end = 8  # the packed fields must tile the row after the stamp, without overlap
        for f in sorted((f for f in fields if f.stride != f.row_bytes), key=lambda f: f.offset):
            at = f.offset - rows
            if f.stride != stride or at < end or at + f.row_bytes > stride or at % f.dtype.alignment:
                raise bad(f"field {f.name!r} (offset {f.offset}, stride {f.stride}) does not fit in "
                          f"the rows block (offset {rows}, stride {stride}) beside the other fields")
            end = at + f.row_bytes
        blocks += [(f"field {f.name!r}", f.offset, capacity * f.row_bytes) for f in fields
                   if f.stride == f.row_bytes]
        blocks += [(f"region {key!r}", off, length) for key, (off, length) in regions.items()]
        end = HEADER_SIZE
        for what, off, length in sorted(blocks, key=lambda b: b[1]):
            if off % ALIGN:
                raise bad(f"the {what} at offset {off} is not aligned to {ALIGN} bytes")
            if off < end:
                raise bad(f"the {what} at offset {off} overlaps the header or another block")
            end = off + length
            if end > total:
                raise bad(f"the {what} lies outside the segment ({off} + {length} > {total})")
        return cls(fields, capacity, lanes, flags, total, schema_off, schema_size, control,
                   lanes_off, res_off, n_res, rows, stride, pid, ctime, created_at, meta, regions)


def _parse_schema(raw: bytes) -> tuple[tuple[Field, ...], dict[str, Any], dict[str, tuple[int, int]]]:
    """The fields, metadata and regions of a stored schema, checked like a user's;
    FormatError if bad."""
    try:
        doc = json.loads(raw.decode("utf-8"))
        if not isinstance(doc, dict) or set(doc) != {"fields", "meta", "regions"}:
            raise FormatError("the schema is not an object of fields, meta and regions")
        items, meta, regions = doc["fields"], check_meta(doc["meta"]), doc["regions"]
        if not isinstance(regions, dict) or not all(
                isinstance(v, list) and len(v) == 2 and all(type(x) is int and x >= 0 for x in v)
                for v in regions.values()):
            raise FormatError(f"the regions are not an object of [offset, bytes] pairs: {regions!r:.200}")
        regions = {k: (v[0], v[1]) for k, v in regions.items()}
        if not isinstance(items, list) or not items:
            raise FormatError("the schema is not a non-empty list of fields")
        spec, offsets = {}, []
        for d in items:
            if not isinstance(d, dict) or set(d) != {"name", "dtype", "shape", "offset", "stride"}:
                raise FormatError(f"a schema entry is not a field description: {d!r:.200}")
            name, shape, offset, stride = d["name"], d["shape"], d["offset"], d["stride"]
            if not isinstance(name, str) or name in spec:
                raise FormatError(f"field names must be unique strings, got {name!r:.100}")
            if not isinstance(shape, list) or not all(type(x) is int for x in shape) \
                    or type(offset) is not int or offset < 0 or type(stride) is not int:
                raise FormatError(f"field {name!r:.100}: bad shape {shape!r:.100}, offset {offset!r} "
                                  f"or stride {stride!r}")
            spec[name] = (tuple(shape), dtype_from_json(d["dtype"]))
            offsets.append((offset, stride))
        fields = normalize_fields(spec)
    except FormatError:
        raise
    except Exception as exc:  # json, unicode, numpy and our own schema checks: all untrusted input
        raise FormatError(f"unreadable schema ({type(exc).__name__}: {exc})"[:500]) from None
    for f, (shape, _), (_, stride) in zip(fields, spec.values(), offsets):
        if f.shape != shape:
            raise FormatError(f"field {f.name!r}: its dtype has a sub-array")
        if stride != f.row_bytes and not (f.row_bytes <= PACK_LIMIT and stride > f.row_bytes):
            raise FormatError(f"field {f.name!r}: stride {stride} for rows of {f.row_bytes} bytes")
    return tuple(Field(f.name, f.shape, f.dtype, off, stride)
                 for f, (off, stride) in zip(fields, offsets)), meta, regions


def from_flat(flat: Mapping[str, Any]) -> dict[str, Any]:
    """The ``meta`` of a layout from the one flat object of a segment of version
    :data:`FLAT_META_VERSION` (or a save of format 1), where the user's keys and the
    library's were mixed and the library read them all: the library's are all of it
    (the buffer behaves as it did), and so are the user's (``Buffer.meta`` returned it
    all). The one place the flat object is read.

    Examples:
        >>> from_flat({"kind": "episodes", "note": 1})
        {'kind': 'episodes', 'note': 1, 'user': {'kind': 'episodes', 'note': 1}}
    """
    return {**flat, USER: dict(flat)}


def check_meta(meta: Any) -> dict[str, Any]:
    """``meta`` as a dict that survives a JSON round trip unchanged (ValueError if not)."""
    meta = {} if meta is None else meta
    try:
        ok = isinstance(meta, dict) and json.loads(json.dumps(meta)) == meta
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ValueError(f"meta must be a JSON object of strings, numbers, lists and objects, got {meta!r:.200}")
    return meta


def _schema_bytes(fields: Any, meta: Mapping[str, Any], regions: Mapping[str, tuple[int, int]]) -> bytes:
    return json.dumps({"fields": [
        {"name": f.name, "dtype": npformat.dtype_to_descr(f.dtype), "shape": list(f.shape),
         "offset": f.offset, "stride": f.stride} for f in fields
    ], "meta": meta, "regions": {k: list(v) for k, v in regions.items()}},
        separators=(",", ":")).encode("utf-8")
