"""Ragged fields as a part (``Buffer.create`` with a field shaped ``(None, ...)`` or
``("R", ...)``, and ``arena=``; see :mod:`shmbuf.parts`): each row's values of its
ragged fields kept in a record of its lane's arena (:mod:`shmbuf.core.arena`), read back
as :class:`~shmbuf.ragged.jagged.Jagged` (:mod:`shmbuf.ragged.rows`).

The spec: ``{"fields": [{name, dim, shape, dtype}...], "arena": bytes}`` (every lane's
arenas together)."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from shmbuf.core import arena
from shmbuf.ragged import schema
from shmbuf.ragged.rows import Rows, check_values

KEY = "ragged"
KEYWORD = "arena"
EXCLUDES = {
    "max_times_sampled": "a limited sampler counts a row as it returns it, before its record is read; "
                         "leave max_times_sampled= out",
}


def spec(value: Any) -> dict | None:
    """``value``: None, or ``{"fields": [...], "arena": bytes}`` (``Buffer.create`` makes
    it from the schema's ragged fields and ``arena=``)."""
    if value is None:
        return None
    if not isinstance(value, Mapping) or set(value) != {"fields", "arena"}:
        raise ValueError(f"a ragged spec is {{'fields': [...], 'arena': bytes}}, got {value!r:.200}")
    got = schema.fields(value)
    size = value["arena"]
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 64:
        raise ValueError(f"arena= must be an int of bytes >= 64 (room for the ragged fields' values of "
                         f"every lane), got {size!r}")
    return {"fields": [{"name": r.name, "dim": r.dim, "shape": list(r.trailing),
                        "dtype": value["fields"][i]["dtype"]} for i, r in enumerate(got)],
            "arena": int(size)}


def said(spec_: dict) -> str:
    """How an error names this part: the ragged fields and ``arena=``."""
    return f"ragged fields {[r['name'] for r in spec_['fields']]} (arena={spec_['arena']})"


def keyword(spec_: dict | None) -> dict | None:
    return None if spec_ is None else {"fields": [dict(r) for r in spec_["fields"]], "arena": spec_["arena"]}


def plan(spec_: dict, p: Any) -> None:
    d = schema.dims(schema.fields(spec_))
    p.add_field(schema.FIELD, (2 + len(d),), np.int64, "a buffer with ragged fields keeps each row's record there")
    p.add_field(schema.GROUP, (2,), np.int64, "a buffer with ragged fields keeps each row's place in its write there")
    p.add_region(arena.REGION, arena.region_bytes(p.capacity, p.lanes, arena.lane_bytes(spec_["arena"], p.lanes)))


def open(spec_: dict, engine: Any) -> dict[str, Any]:
    ragged = schema.fields(spec_)
    d = schema.dims(ragged)
    layout = engine.layout
    lane_arena = arena.lane_bytes(spec_["arena"], layout.lanes)
    region = layout.regions[arena.REGION]
    if region[1] != arena.region_bytes(layout.capacity, layout.lanes, lane_arena):
        raise ValueError(f"its region {arena.REGION!r} holds {region[1]} bytes, not the arena its spec records")
    a = arena.Arena(engine.ring, engine.seg.mmap, region, lane_arena, schema.FIELD,
                    [(d.index(r.key), r.element_bytes) for r in ragged], engine.seg)
    engine.ring.records = a
    return {"records": Rows(engine, a, ragged, d)}


def check_state(spec_: dict, layout: Any, state: Any, checked: dict, where: str) -> dict:
    """``checked`` (:func:`shmbuf.core.contents.check`'s) with the ragged values of
    ``state`` checked for a buffer of this spec and ``layout`` (:func:`shmbuf.ragged.rows.check_values`),
    before any buffer is made (a load's: ``where`` names the values in its errors)."""
    return check_values(schema.fields(spec_), arena.lane_bytes(spec_["arena"], layout.lanes), layout, state,
                        checked, where)
