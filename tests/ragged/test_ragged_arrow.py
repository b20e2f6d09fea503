"""Jagged <-> pyarrow (an optional extra): the same memory where the layouts agree
(buffer addresses compared), equal rows everywhere else, refusals for what a Jagged
cannot hold."""

from __future__ import annotations

import numpy as np
import pytest

import shmbuf
from shmbuf import Jagged

pa = pytest.importorskip("pyarrow", reason="pyarrow is an optional extra: pip install 'shmbuf[arrow]'")
from shmbuf.ragged.arrow import to_table  # noqa: E402

pytestmark = pytest.mark.extras


def rows(j: Jagged) -> list:
    return [j[i].tolist() for i in range(len(j))]


def leaf(a):
    """The primitive array under a list array's fixed-size lists."""
    child = a.values
    while isinstance(child, pa.FixedSizeListArray):
        child = child.values
    return child


def test_to_arrow_wraps_the_values_and_offsets_without_a_copy():
    j = Jagged.from_rows([[1, 2, 3], [], [4]], dtype=np.int32)
    a = j.to_arrow()
    assert isinstance(a, pa.LargeListArray) and a.type == pa.large_list(pa.int32())
    assert a.buffers()[1].address == j.offsets.ctypes.data       # the offsets: the same memory
    assert leaf(a).buffers()[1].address == j.values.ctypes.data  # the values: the same memory
    assert a.to_pylist() == [[1, 2, 3], [], [4]]
    j.values[0] = 9  # (and a write shows through)
    assert a.to_pylist()[0] == [9, 2, 3]
    back = Jagged.from_arrow(a)
    assert back.values.ctypes.data == j.values.ctypes.data and back.offsets.ctypes.data == j.offsets.ctypes.data


def test_trailing_dimensions_are_fixed_size_lists_inside(name):
    with shmbuf.Buffer.create({"e": ((None, 2, 3), np.int16), "k": ((), np.int64)}, 8, name=name, arena=1 << 12) as b:
        b.extend({"e": [np.arange(6 * n, dtype=np.int16).reshape(n, 2, 3) for n in (2, 0, 1)], "k": [2, 0, 1]})
        j = b.sample(6)["e"]  # (a batch's Jagged: a view of its block)
        a = j.to_arrow()
        assert a.type == pa.large_list(pa.list_(pa.list_(pa.int16(), 3), 2))
        assert leaf(a).buffers()[1].address == j.values.ctypes.data
        assert a.to_pylist() == [j[i].tolist() for i in range(6)]
        back = Jagged.from_arrow(a)
        assert back.values.shape[1:] == (2, 3) and back.values.ctypes.data == j.values.ctypes.data
        assert rows(back) == rows(j)


def test_arrays_pyarrow_made_come_back_equal_and_copies_where_the_layouts_differ():
    big = pa.array([[1, 2], [3], [], [4, 5, 6]], type=pa.large_list(pa.int64()))
    assert rows(Jagged.from_arrow(big)) == [[1, 2], [3], [], [4, 5, 6]]
    small = pa.array([[1, 2], [3]], type=pa.list_(pa.float32()))  # (int32 offsets: a copy of them)
    j = Jagged.from_arrow(small)
    assert j.offsets.dtype == np.int64 and j.values.dtype == np.float32 and rows(j) == [[1, 2], [3]]
    part = Jagged.from_arrow(big[1:4])  # (a slice: offsets rebased to 0)
    assert part.offsets.tolist() == [0, 1, 1, 4] and rows(part) == [[3], [], [4, 5, 6]]
    chunked = Jagged.from_arrow(pa.chunked_array([big[:2], big[2:]]))
    assert rows(chunked) == [[1, 2], [3], [], [4, 5, 6]]
    flags = Jagged.from_rows([[True, False], [True]], dtype=np.bool_)  # (bits in Arrow: copied, both ways)
    assert rows(Jagged.from_arrow(flags.to_arrow())) == [[True, False], [True]]
    strided = Jagged(np.arange(12, dtype=np.int64)[::2], np.array([0, 4, 6]))  # (not contiguous: copied)
    assert strided.to_arrow().to_pylist() == [[0, 2, 4, 6], [8, 10]]
    empty = Jagged.from_rows([], dtype=np.float32)
    assert len(empty.to_arrow()) == 0 and len(Jagged.from_arrow(empty.to_arrow())) == 0


def test_what_a_jagged_cannot_hold_is_refused():
    with pytest.raises(ValueError, match="null rows"):
        Jagged.from_arrow(pa.array([[1], None], type=pa.large_list(pa.int64())))
    with pytest.raises(ValueError, match="values hold nulls"):
        Jagged.from_arrow(pa.array([[1, None]], type=pa.large_list(pa.int64())))
    with pytest.raises(ValueError, match="takes a pyarrow ListArray or LargeListArray"):
        Jagged.from_arrow(pa.array([1, 2]))
    with pytest.raises(ValueError, match="not numbers"):
        Jagged.from_arrow(pa.array([["a"]], type=pa.large_list(pa.string())))


def test_a_batch_becomes_a_table_over_its_memory(name):
    schema = {"r": (("R",), np.int32), "lp": (("R",), np.float32), "reward": ((), np.float32),
              "obs": ((3,), np.float64)}
    with shmbuf.Buffer.create(schema, 16, name=name, arena=1 << 14, seed=0) as b:
        b.extend({"r": [np.arange(n, dtype=np.int32) for n in (3, 5, 1)], "lp": [np.zeros(n) for n in (3, 5, 1)],
                  "reward": [1.0, 2.0, 3.0], "obs": np.arange(9.0).reshape(3, 3)})
        batch = b.sample(8)
        t = to_table(batch)
        assert t.column_names == list(batch) and t.num_rows == 8
        assert t.schema.field("obs").type == pa.list_(pa.float64(), 3)
        assert t.column("reward").chunk(0).buffers()[1].address == batch["reward"].ctypes.data
        assert leaf(t.column("r").chunk(0)).buffers()[1].address == batch["r"].values.ctypes.data
        assert t.column("r").to_pylist() == rows(batch["r"]) and t.column("obs").to_pylist() == batch["obs"].tolist()
        with pytest.raises(ValueError, match="different numbers of rows"):
            to_table({"reward": batch["reward"], "r": batch["r"][:3]})
