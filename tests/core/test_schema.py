"""What schemas, capacities and lane counts are accepted, and the errors for the rest."""

from __future__ import annotations

import numpy as np
import pytest

import shmbuf
from shmbuf.core.layout import normalize_fields


def test_accepts_shapes_and_dtypes():
    fs = normalize_fields({"a": ((), np.float32), "b": (3, "int16"), "c": ([2, 2], bool),
                           "d": ((2,), [("x", "<i4"), ("y", "<f8", (3,))]), "e": ((), "S5"),
                           "f": ((4,), ("f4", (2,)))})
    shapes = {f.name: f.shape for f in fs}
    assert shapes == {"a": (), "b": (3,), "c": (2, 2), "d": (2,), "e": (), "f": (4, 2)}


@pytest.mark.parametrize("fields, match", [
    ({}, "non-empty mapping"),
    ([("a", ((), "f4"))], "non-empty mapping"),
    ({"": ((), "f4")}, "non-empty strings"),
    ({1: ((), "f4")}, "non-empty strings"),
    ({"a": "f4"}, r"\(shape, dtype\) pair"),
    ({"a": ((), "f4", 1)}, r"\(shape, dtype\) pair"),
    ({"a": ((-1,), "f4")}, "must be >= 0"),
    ({"a": ((0,), "f4")}, "0 bytes per row"),
    ({"a": ((2.5,), "f4")}, "must be an integer"),
])
def test_rejects_bad_schema_value(fields, match):
    with pytest.raises((ValueError, TypeError), match=match):
        normalize_fields(fields)


@pytest.mark.parametrize("dtype, match", [(object, "Python objects"), ("nonsense", "not a numpy dtype"),
                                          ([("a", object)], "Python objects")])
def test_rejects_bad_dtypes(dtype, match):
    with pytest.raises(TypeError, match=match):
        normalize_fields({"a": ((), dtype)})


@pytest.mark.parametrize("capacity, lanes, match", [
    (0, 1, "capacity must be >= 1"), (-5, 1, "capacity must be >= 1"),
    (10, 0, "lanes must be >= 1"), (10, 3, "multiple of lanes"), (True, 1, "integer"),
    (2.0, 1, "integer"),
])
def test_rejects_bad_capacity_and_lanes(capacity, lanes, match):
    with pytest.raises((ValueError, TypeError), match=match):
        shmbuf.Buffer.create({"x": ((), "f4")}, capacity, lanes=lanes)


def test_arrays_are_aligned(name):
    """Blocks start on cache lines; packed values are naturally aligned in every row."""
    fields = {"a": ((3,), "int8"), "b": ((), "float64"), "c": ((5,), "int16"),
              "big": ((1200,), "uint8")}
    with shmbuf.Buffer.create(fields, 7, name=name) as buf:
        arrays = buf.engine.ring.arrays
        assert buf.engine.ring.stamps.ctypes.data % 64 == 0 and arrays["big"].ctypes.data % 64 == 0
        assert not buf.engine.layout.fields[3].packed and all(f.packed for f in buf.engine.layout.fields[:3])
        for arr in list(arrays.values()) + [buf.engine.ring.stamps]:
            assert arr.ctypes.data % arr.dtype.alignment == 0
            assert arr.strides[0] % arr.dtype.alignment == 0
        assert buf.engine.layout.total_size <= buf.engine.seg.size  # logical size stored; OS rounds up


def test_meta_is_kept_with_the_schema_and_checked(name):
    meta = {"kind": "episodes", "observations": ["obs"], "frame_stack": 4}
    with shmbuf.Buffer.create({"x": ((), "int64")}, 4, name=name, meta=meta) as buf:
        other = shmbuf.Buffer.attach(name)
        assert other.meta == meta and buf.meta == meta
        other.meta["kind"] = "changed"  # a copy
        assert other.meta == meta
        other.close()
    with shmbuf.Buffer.create({"x": ((), "int64")}, 4) as buf:
        assert buf.meta == {}
    for bad in ([1], {"x": object()}, {"x": (1, 2)}, {1: "a"}):
        with pytest.raises(ValueError, match="meta must be a JSON object"):
            shmbuf.Buffer.create({"x": ((), "int64")}, 4, meta=bad)


X = {"x": ((), "int64")}
# What the library keeps of its own in a layout's meta, given by a user instead: none of
# it may change what the buffer does.
LIBRARY_KEYS = {
    "sampler": {"sampler": "newest"},
    "versions": {"versions": True},
    "priority": {"priority": {"alpha": 0.6}},
    "queue": {"queue": {"version": 1}},
    "rate": {"rate": {"min_size": 1000, "samples_per_insert": 1.0, "error_buffer": 1.0}},
    "max_times_sampled": {"sampler": "limited", "max_times_sampled": 1},
    "episodes": {"kind": "episodes", "observations": ["x"], "reward": None, "frame_stack": 1},
    "user": {"user": {"sampler": "newest"}, "sampler": "newest"},
}


@pytest.mark.parametrize("meta", LIBRARY_KEYS.values(), ids=LIBRARY_KEYS.keys())
def test_a_users_meta_is_returned_as_given_and_switches_no_capability(name, meta):
    """Trust round 4, item 2: ``meta={"sampler": "newest"}`` picked the newest-first
    sampler, ``meta={"versions": True}`` made every write fail, and so on: the user's
    metadata and the library's were one dict. Now the user's lives apart, is returned
    exactly as given, and the buffer is exactly the one made without it (same samples
    from the same seed, same state)."""
    with shmbuf.Buffer.create(X, 64, name=name, seed=3, meta=meta) as buf, \
            shmbuf.Buffer.create(X, 64, name=name + "-plain", seed=3) as plain:
        for b in (buf, plain):
            b.extend({"x": np.arange(40)})
            b.add({"x": 40})
        assert buf.meta == meta
        with shmbuf.Buffer.attach(name) as other:
            assert other.meta == meta and type(other.sampler) is type(plain.sampler)
        assert {k: v for k, v in buf.engine.layout.meta.items() if k != "user"} == {"parts": {}}
        assert (buf.versioned, buf.prioritized, buf.max_times_sampled) == (False, False, None)
        for _ in range(3):
            assert buf.sample(16, timeout=0.5)["x"].tolist() == plain.sample(16, timeout=0.5)["x"].tolist()
        got, want = buf.state_dict(), plain.state_dict()
        assert got["fields"] == want["fields"] and sorted(got) == sorted(want)
        for k in ("heads", "bases", "stamps"):
            assert (got[k] == want[k]).all()
        assert all((got["data"][k] == want["data"][k]).all() for k in want["data"])


def test_an_episode_buffers_meta_is_the_users_exactly(name):
    """EpisodeBuffer.create(meta=...) merged the user's keys with its own (its "kind",
    "observations", ...), the user's overwritten; now they are apart."""
    user = {"kind": "mine", "observations": ["nope"], "reward": "r", "frame_stack": 9, "sampler": "newest"}
    with shmbuf.EpisodeBuffer.create({"obs": ((2,), np.float32), "reward": ((), np.float32)}, 32,
                                     name=name, meta=user) as ebuf:
        assert ebuf.core.meta == user
        other = shmbuf.EpisodeBuffer.attach(name)
        assert (other.observations, other.reward, other.frame_stack, other.core.meta) == (["obs"], "reward", 1, user)
        other.close()


def _as_previous_format(buf, flat, version=4):
    """Rewrite ``buf``'s segment as the previous format wrote it: header version 4, the
    schema's meta one flat object."""
    import json
    import struct

    lay, mem = buf.engine.layout, buf.engine.seg.mmap
    doc = json.loads(bytes(mem[lay.schema_offset:lay.schema_offset + lay.schema_size]))
    doc["meta"] = flat
    raw = json.dumps(doc, separators=(",", ":")).encode()
    assert len(raw) <= lay.schema_size
    mem[lay.schema_offset:lay.schema_offset + lay.schema_size] = raw.ljust(lay.schema_size, b" ")
    struct.pack_into("<I", mem, 8, version)


def test_a_segment_of_the_previous_format_attaches_as_it_was_made(name):
    """A version-4 segment (one flat meta, the library read all of it) attaches: its
    capabilities as made, its whole meta returned as the user's (as before); a version
    it never wrote is refused, naming it."""
    flat = {"sampler": "newest", "run": 7}
    with shmbuf.Buffer.create(X, 8, name=name, sampler="newest") as buf:
        buf.extend({"x": np.arange(8)})
        _as_previous_format(buf, flat)
        with shmbuf.Buffer.attach(name) as old:
            assert old.meta == flat and type(old.sampler).__name__ == "Newest"
            assert sorted(old.sample(3)["x"].tolist()) == [5, 6, 7]
        _as_previous_format(buf, {"sampler": "newest", "user": {"run": 7}}, version=5)  # (its settings apart)
        with shmbuf.Buffer.attach(name) as old:
            assert old.meta == {"run": 7} and old.parts.specs == {"sampler": {"name": "newest", "options": {}}}
            assert sorted(old.sample(3)["x"].tolist()) == [5, 6, 7]
        _as_previous_format(buf, flat, version=3)
        with pytest.raises(shmbuf.FormatError, match="format version 3, but this shmbuf reads versions 4 to 6"):
            shmbuf.Buffer.attach(name)


def test_the_parts_of_a_segment_are_its_record_of_them(name):
    """A version-6 segment's parts are what its meta records under "parts" (never its
    other keys); one without that record, or a version-5 one with it, is refused."""
    with shmbuf.Buffer.create(X, 8, name=name, sampler="newest", meta={"versions": True}) as buf:
        lay = buf.engine.layout
        assert lay.meta["parts"] == {"sampler": {"name": "newest", "options": {}}} and not buf.versioned
        _as_previous_format(buf, {"user": {}, "sampler": "newest"}, version=6)
        with pytest.raises(shmbuf.FormatError, match="no object under 'parts'"):
            shmbuf.Buffer.attach(name)
        _as_previous_format(buf, {"user": {}, "parts": {}}, version=5)
        with pytest.raises(shmbuf.FormatError, match="meta of version 5 has a key 'parts'"):
            shmbuf.Buffer.attach(name)
        _as_previous_format(buf, {"user": {}, "parts": {"sampler": {"name": "lifo", "options": {}}}}, version=6)
        with pytest.raises(ValueError, match="got 'lifo'"):
            shmbuf.Buffer.attach(name)


def test_a_segment_whose_meta_has_no_users_object_is_refused(name):
    with shmbuf.Buffer.create(X, 8, name=name) as buf:
        _as_previous_format(buf, {"sampler": "newest"}, version=5)
        with pytest.raises(shmbuf.FormatError, match="no object under 'user'"):
            shmbuf.Buffer.attach(name)
