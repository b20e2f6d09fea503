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
