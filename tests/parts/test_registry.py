"""The parts registry (shmbuf/parts): specs from create's keywords, pairs refused,
plans, the record in the segment read back, older segments' settings read once."""

from __future__ import annotations

import ast
import itertools
import pathlib

import numpy as np
import pytest

import shmbuf
from shmbuf import parts

X = {"x": ((), "int64")}
ASKED = {"mode": "queue", "priority": 0.6, "versions": True, "max_times_sampled": 2,
         "rate": shmbuf.RateLimit(samples_per_insert=1.0, min_size=1, error_buffer=100.0), "sampler": "newest"}
KEYS = {m.KEYWORD: m.KEY for m in parts.modules()}


@pytest.mark.parametrize("a, b", list(itertools.combinations(ASKED, 2)))
def test_every_pair_is_made_or_refused_with_one_error_naming_both(name, a, b):
    """A pair that one of its parts excludes is refused before anything is made, by one
    error naming both keywords and why; any other pair makes a buffer whose parts are
    exactly the two, read back the same by a handle that attaches."""
    ma, mb = (next(m for m in parts.modules() if m.KEYWORD == k) for k in (a, b))
    excluded = KEYS[b] in ma.EXCLUDES or KEYS[a] in mb.EXCLUDES
    if excluded:
        with pytest.raises(ValueError, match=rf"{a}=.* and {b}=.* do not go together: |{b}=.* and {a}=.* do not go"):
            shmbuf.Buffer.create(X, 8, name=name, **{a: ASKED[a], b: ASKED[b]})
        assert name not in shmbuf.core.segment.list_names()
        return
    with shmbuf.Buffer.create(X, 8, name=name, **{a: ASKED[a], b: ASKED[b]}) as buf:
        assert sorted(buf.parts.specs) == sorted([KEYS[a], KEYS[b]])
        assert buf.parts.keywords[a] == ASKED[a] or (a == "rate" and buf.parts.keywords[a].to_meta() ==
                                                     ASKED[a].to_meta())
        with shmbuf.Buffer.attach(name) as other:
            assert other.parts.specs == buf.parts.specs and type(other.sampler) is type(buf.sampler)
            assert type(other.engine.writes) is type(buf.engine.writes)


def test_the_keywords_come_back_from_the_specs_and_the_defaults_record_nothing():
    assert parts.specs({"mode": "replay", "priority": None, "versions": False, "max_times_sampled": None,
                        "rate": None, "sampler": "uniform"}) == {}
    made = parts.specs({"mode": "queue", "versions": True})
    assert parts.keywords(made) == {"mode": "queue", "versions": True, "priority": None, "max_times_sampled": None,
                                    "rate": None, "sampler": "uniform", "arena": None}
    assert parts.own_fields(made) == {"_queued", "version"}
    with pytest.raises(ValueError, match="parts must be {key: spec} with keys among"):
        parts.check({"cache": {}})


def test_a_part_field_a_user_passes_is_refused():
    for kw, field in (({"mode": "queue"}, "_queued"), ({"priority": 0.6}, "_priority"),
                      ({"versions": True}, "version"), ({"max_times_sampled": 1}, "times_sampled")):
        with pytest.raises(ValueError, match=f"fields must be a mapping without {field!r}: "):
            shmbuf.Buffer.create({**X, field: ((), "int64")}, 8, **kw)


def test_older_segments_settings_are_read_once_into_specs():
    """A version-5 segment's (and a format-2 save's) settings, keys of the metadata
    itself, become the specs their parts record now; the other keys stay."""
    meta = {"queue": {"version": 1}, "versions": True, "kind": "episodes", "user": {"a": 1}}
    assert parts.legacy(meta) == {"kind": "episodes", "user": {"a": 1}, "parts": {"queue": {}, "versions": {}}}
    assert parts.legacy({"sampler": "limited", "max_times_sampled": 3, "priority": None})["parts"] == \
        {"max_times_sampled": {"k": 3}}
    # (version 4: a user's "sampler" beside a queue's or priorities' settings; they came first, as then)
    assert parts.legacy({"priority": {"alpha": 0.5}, "sampler": "newest"})["parts"] == {"priority": {"alpha": 0.5}}
    assert parts.legacy({"queue": {"version": 1}, "sampler": "newest"})["parts"] == {"queue": {}}


def test_capability_keys_are_read_only_by_the_registry():
    """No module outside shmbuf/parts reads a capability's setting out of the metadata
    (``meta["queue"]``, ``meta.get("priority")``, ``"rate" in meta``, ...; whatever the
    variable is called): each part knows its own spec, the registry the rest, and the
    others ask a handle's ``parts`` (its ``keywords``, ``specs``, ``roles``)."""
    package = pathlib.Path(shmbuf.__file__).parent
    keys = {"queue", "priority", "sampler", "versions", "max_times_sampled", "rate"}
    found = []
    for path in package.rglob("*.py"):
        if path.parent.name == "parts" and path.parent.parent == package:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            key = None
            if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
                key, on = node.slice.value, node.value
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in (
                    "get", "pop") and node.args and isinstance(node.args[0], ast.Constant):
                key, on = node.args[0].value, node.func.value
            elif isinstance(node, ast.Compare) and isinstance(node.left, ast.Constant) and \
                    isinstance(node.ops[0], (ast.In, ast.NotIn)):
                key, on = node.left.value, node.comparators[0]
            text = "" if key not in keys else ast.unparse(on)
            if any(w in text for w in ("meta", "described", "layout", "lay.")) \
                    and not text.endswith((".keywords", ".roles", ".specs")):  # (the registry's own answers)
                found.append(f"{path.relative_to(package)}:{node.lineno}: {ast.unparse(node)}")
    assert found == [], found
