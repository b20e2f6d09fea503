"""The parts registry: every capability a buffer can be created with, planned when it is
created and rebuilt, the same, by every handle that attaches.

A **part** is a module (``shmbuf/<capability>/part.py``) that describes itself:

* ``KEY``: its key in the segment's record of parts (``layout.meta["parts"]``), and
  ``KEYWORD``: the :meth:`shmbuf.Buffer.create` keyword that asks for it (the public
  spelling: ``mode="queue"``, ``priority=0.6``, ``sampler=("recency", {"tau": 1e4})``...);
* ``spec(value)``: that keyword's value checked and turned into the part's **spec**, a
  JSON object (None: the part is not wanted), and ``keyword(spec)``, the other way;
* ``EXCLUDES``: ``{other KEY: why}``, the parts it cannot be combined with;
* ``plan(spec, plan)``: adds the fields and regions it keeps in the segment to a
  :class:`Plan`;
* ``open(spec, engine)``: the live part, as the roles it plays (``writes``, ``gate``,
  ``priorities`` for the engine; ``sampler``, ``versions`` for the handle), a dict.

``Buffer.create`` builds the specs from its keywords (:func:`specs`), refuses a pair
that excludes each other with one error (:func:`check`), lets each part plan
(:func:`plan`) and records the specs; a handle that opens the segment reads them back
(:class:`Parts`) and opens each part on its engine, which holds them without knowing
what they are. The specs are the whole description: a process that attaches, a save and
its load, ``shmbuf show`` all rebuild the same parts from them (Reverb's table
``options()`` is the model). Segments of layout version 4 and 5 (and saves of format 1
and 2) kept the capabilities' settings as keys of the metadata itself: :func:`legacy`
reads them, here and nowhere else.

Examples:
    >>> from shmbuf import parts
    >>> s = parts.specs({"mode": "queue", "versions": True})
    >>> s
    {'queue': {}, 'versions': {}}
    >>> parts.keywords(s)["mode"], parts.keywords(s)["priority"]
    ('queue', None)
    >>> parts.specs({"mode": "queue", "priority": 0.6})
    Traceback (most recent call last):
    ...
    ValueError: mode='queue' and priority=0.6 do not go together: a queue is consumed in order with take(), never sampled by priority; create a replay buffer (the default mode) for priority=
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any, Mapping

from shmbuf.core.batch import count
from shmbuf.core.segment import FormatError

MODULES = ("shmbuf.queue.part", "shmbuf.versions.part", "shmbuf.priority.part", "shmbuf.limited.part",
           "shmbuf.rate.part", "shmbuf.samplers.part", "shmbuf.ragged.part")
"""The parts, in the order they plan and open (a write goes through the write part a
queue or a limit gives, the gate a rate limit gives, then the ring)."""

ROLES = ("writes", "gate", "priorities", "sampler", "versions", "records")
"""What an opened part may play; two parts never play the same role (their exclusions
see to it)."""


def modules() -> list[ModuleType]:
    """The part modules, in :data:`MODULES` order."""
    return [importlib.import_module(m) for m in MODULES]


def _by_key() -> dict[str, ModuleType]:
    return {m.KEY: m for m in modules()}


class Plan:
    """What a new buffer's segment holds beyond the user's fields: the parts add their
    fields and regions here (``Buffer.create`` lays out the segment from it)."""

    def __init__(self, fields: Any, capacity: Any, lanes: Any, regions: Mapping[str, int], durable: bool) -> None:
        self.fields: Any = fields
        self._capacity, self._lanes, self.durable = capacity, lanes, durable
        self.regions = dict(regions)

    @property
    def capacity(self) -> int:
        """The buffer's rows (checked: a ``TypeError``/``ValueError`` for a bad one)."""
        return count(self._capacity, "capacity", 1)

    @property
    def lanes(self) -> int:
        return count(self._lanes, "lanes", 1)

    def add_field(self, name: str, shape: tuple, dtype: Any, why: str) -> None:
        """A field the part keeps in every row (``why``: what it holds, for the error of a
        user's field of the same name)."""
        if not isinstance(self.fields, Mapping) or name in self.fields:
            raise ValueError(f"fields must be a mapping without {name!r}: {why}")
        self.fields = {**self.fields, name: (shape, dtype)}

    def add_region(self, name: str, nbytes: int) -> None:
        if name in self.regions:
            raise ValueError(f"region {name!r} is planned twice")
        self.regions[name] = nbytes


def specs(given: Mapping[str, Any]) -> dict[str, dict]:
    """The specs of the parts that ``Buffer.create``'s keywords ``given`` (``{keyword:
    value}``, defaults allowed) ask for, checked (:func:`check`)."""
    out = {}
    for m in modules():
        s = m.spec(given.get(m.KEYWORD)) if m.KEYWORD in given else None
        if s is not None:
            out[m.KEY] = s
    check(out)
    return out


def check(specs_: Mapping[str, Any]) -> dict[str, dict]:
    """``specs_`` if every key names a part and no two exclude each other; else the
    ``ValueError`` that names the pair and why."""
    known = _by_key()
    if not isinstance(specs_, Mapping) or any(k not in known or not isinstance(v, dict) for k, v in specs_.items()):
        raise ValueError(f"parts must be {{key: spec}} with keys among {sorted(known)}, got {specs_!r:.200}")
    for key, spec in specs_.items():
        for other, why in known[key].EXCLUDES.items():
            if other in specs_:
                a, b = known[key], known[other]
                raise ValueError(f"{_said(a, spec)} and {_said(b, specs_[other])} do not go together: {why}")
    return dict(specs_)


def _said(m: ModuleType, spec: dict) -> str:
    """A part as an error names it: ``keyword=value`` (a part's own ``said(spec)``, if it
    has one: a spec too long to read)."""
    return m.said(spec) if hasattr(m, "said") else f"{m.KEYWORD}={m.keyword(spec)!r}"


def plan(specs_: Mapping[str, dict], p: Plan) -> Plan:
    """Each part's fields and regions, added to ``p`` (in :data:`MODULES` order)."""
    for m in modules():
        if m.KEY in specs_:
            m.plan(specs_[m.KEY], p)
    return p


def keywords(specs_: Mapping[str, dict]) -> dict[str, Any]:
    """``Buffer.create``'s keywords that make these parts (every part's, its default if
    absent): what a save gives back to ``load``, what ``shmbuf show`` prints."""
    return {m.KEYWORD: m.keyword(specs_[m.KEY]) if m.KEY in specs_ else m.keyword(None) for m in modules()}


def own_fields(specs_: Mapping[str, dict]) -> set[str]:
    """The fields these parts add to every row (those a user never passes)."""
    return set(plan(specs_, Plan({}, 1, 1, {}, False)).fields)


def legacy(meta: Mapping[str, Any]) -> dict[str, Any]:
    """The metadata of a segment of layout version 4 or 5 (or a save of format 1 or 2),
    whose capabilities' settings were keys of its own, with them as specs under
    ``"parts"`` (each key turned into the spec its part records now)."""
    meta = dict(meta)
    found: dict[str, Any] = {}
    if meta.pop("queue", None) is not None:
        found["mode"] = "queue"
    prio = meta.pop("priority", None)
    if prio is not None:
        found["priority"] = prio.get("alpha") if isinstance(prio, dict) else prio
    if meta.pop("versions", None):
        found["versions"] = True
    k = meta.pop("max_times_sampled", None)
    if k is not None:
        found["max_times_sampled"] = k
    rate = meta.pop("rate", None)
    if rate is not None:
        found["rate"] = importlib.import_module("shmbuf.rate.limit").RateLimit.from_meta(rate)
    sampler = meta.pop("sampler", None)
    if sampler not in (None, "limited") and not found.keys() & {"mode", "priority", "max_times_sampled"}:
        found["sampler"] = sampler  # (a queue's, a prioritized or limited buffer's own came first, as they read)
    meta["parts"] = specs(found)
    return meta


class Parts:
    """The parts of a segment, read back from its metadata (its ``"parts"``; older
    segments' keys through :func:`legacy`): :meth:`open` them on a handle's engine.

    Attributes:
        specs: ``{key: spec}``, as recorded.
        keywords: ``Buffer.create``'s keywords that make them (:func:`keywords`).
    """

    def __init__(self, meta: Mapping[str, Any]) -> None:
        try:
            recorded = meta.get("parts") if "parts" in meta else legacy(meta)["parts"]
            self.specs = check(recorded)
            self.keywords = keywords(self.specs)
            for m in modules():  # (each spec as its part makes it from its keyword: checked so)
                if m.KEY in self.specs and m.spec(self.keywords[m.KEYWORD]) != self.specs[m.KEY]:
                    raise ValueError(f"{m.KEY!r}: {self.specs[m.KEY]!r:.200} is not a spec its part makes")
        except (TypeError, ValueError, AttributeError, KeyError) as exc:
            raise FormatError(f"the buffer's record of its parts cannot be opened: {exc}") from None
        self.roles: dict[str, Any] = {}

    def open(self, engine: Any) -> dict[str, Any]:
        """Open every part on ``engine``; returns the roles (``{role: object}``).
        ``FormatError`` if the segment lacks a field a part keeps."""
        missing = own_fields(self.specs) - {f.name for f in engine.fields}
        if missing:
            raise FormatError(f"buffer {engine.name!r} records the parts {sorted(self.specs)}, but it has no field "
                              f"{sorted(missing)} they keep: it is damaged")
        roles: dict[str, Any] = {}
        for m in modules():
            if m.KEY in self.specs:
                for role, part in m.open(self.specs[m.KEY], engine).items():
                    if role not in ROLES or role in roles:
                        raise RuntimeError(f"part {m.KEY!r} plays role {role!r}, which is unknown or taken")
                    roles[role] = part
        self.roles = roles
        return roles

    def check_rows(self, arrays: Mapping[str, Any], kept: Any) -> None:
        """Raise the ``ValueError`` of rows to restore (``arrays``, at the slots ``kept``)
        that hold values of a part's own field it never writes (a part's optional
        ``check_rows(arrays, kept)``: ``max_times_sampled``'s counts below 0): a load
        checks them before it makes the buffer."""
        for m in modules():
            if m.KEY in self.specs and hasattr(m, "check_rows"):
                m.check_rows(arrays, kept)

    def check_state(self, layout: Any, state: Mapping[str, Any], checked: dict, where: str) -> dict:
        """``checked`` (:func:`shmbuf.core.contents.check`'s) with what the parts need to
        restore the rest of ``state`` (a part's optional ``check_state(spec, layout, state,
        checked, where)``: the ragged values of the rows), checked before a load makes the
        buffer; ``where``: what the errors call the state."""
        for m in modules():
            if m.KEY in self.specs and hasattr(m, "check_state"):
                checked = m.check_state(self.specs[m.KEY], layout, state, checked, where)
        return checked

    def __repr__(self) -> str:
        return f"Parts({self.specs!r})"
