"""shmbuf.ragged.jagged.Jagged: one ragged field of a batch (values end to end, offsets).

Checked against plain Python references over random rows (empty rows and trailing
dimensions included); pure numpy, so the same on both paths."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from shmbuf.ragged.jagged import Jagged, as_lengths, padded_width

pytestmark = pytest.mark.one_path


def random_rows(rng: np.random.Generator, n: int, trailing: tuple[int, ...], dtype) -> list[np.ndarray]:
    rows = []
    for _ in range(n):
        length = 0 if rng.random() < 0.25 else int(rng.integers(1, 12))
        rows.append((rng.standard_normal((length,) + trailing) * 100).astype(dtype))
    return rows


def reference_padded(rows, side, value, width, trailing, dtype):
    out = np.full((len(rows), width) + trailing, value, dtype)
    mask = np.zeros((len(rows), width), bool)
    for i, row in enumerate(rows):
        for t in range(len(row)):
            col = t if side == "right" else width - len(row) + t
            out[i, col] = row[t]
            mask[i, col] = True
    return out, mask


CASES = [((), np.int32), ((8,), np.float32), ((2, 3), np.int64)]


@pytest.mark.parametrize("trailing,dtype", CASES)
@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("multiple", [1, 3, 8])
def test_padded_and_mask_match_a_python_reference(trailing, dtype, side, multiple):
    rng = np.random.default_rng(multiple * 7 + len(trailing))
    for n in (0, 1, 5, 17):
        rows = random_rows(rng, n, trailing, dtype)
        j = Jagged.from_rows(rows, dtype=dtype, trailing=trailing)
        longest = max((len(r) for r in rows), default=0)
        width = -(-longest // multiple) * multiple
        want, want_mask = reference_padded(rows, side, -5, width, trailing, dtype)
        got = j.padded(side=side, value=-5, multiple=multiple)
        assert got.dtype == np.dtype(dtype) and got.shape == (n, width) + trailing
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(j.mask(side=side, multiple=multiple), want_mask)
        # a given length (a multiple of multiple, >= the longest row)
        length = width + 2 * multiple
        want, want_mask = reference_padded(rows, side, 0, length, trailing, dtype)
        np.testing.assert_array_equal(j.padded(side=side, multiple=multiple, length=length), want)
        np.testing.assert_array_equal(j.mask(side=side, multiple=multiple, length=length), want_mask)


def test_rows_are_views_and_the_offsets_are_as_given():
    rows = [np.arange(3.0), np.zeros(0), np.arange(4.0) + 10]
    j = Jagged.from_rows(rows)
    assert len(j) == 3 and j.offsets.dtype == np.int64
    np.testing.assert_array_equal(j.offsets, [0, 3, 3, 7])
    np.testing.assert_array_equal(j.lengths, [3, 0, 4])
    assert j.lengths.dtype == np.int64
    for i, row in enumerate(rows):
        np.testing.assert_array_equal(j[i], row)
        np.testing.assert_array_equal(j[i - 3], row)
    assert [len(r) for r in j] == [3, 0, 4]  # iteration, by row
    j[2][0] = -1.0  # a view: writes through
    assert j.values[3] == -1.0 and np.shares_memory(j[2], j.values)
    values, offsets = np.arange(6), np.array([0, 6])
    k = Jagged(values, offsets)
    assert k.values is values and k.offsets is offsets  # neither is copied


@pytest.mark.parametrize("index", [slice(1, 4), slice(None, None, 2), slice(None, None, -1), slice(3, 1),
                                   [3, 0, 0, 4], np.array([-1, 2]), np.array([], np.int64), [],
                                   np.array([True, False, True, True, False])])
def test_selections_are_new_jaggeds_of_copies(index):
    rng = np.random.default_rng(3)
    rows = random_rows(rng, 5, (8,), np.float32)
    rows[1] = rows[1][:0]
    j = Jagged.from_rows(rows, dtype=np.float32, trailing=(8,))
    chosen = np.arange(5)[index]
    part = j[index]
    assert isinstance(part, Jagged) and len(part) == len(chosen)
    assert part.values.shape[1:] == (8,) and part.values.dtype == np.float32
    for k, i in enumerate(chosen):
        np.testing.assert_array_equal(part[k], rows[i])
    np.testing.assert_array_equal(part.lengths, j.lengths[chosen])
    assert not np.shares_memory(part.values, j.values)


@pytest.mark.parametrize("index,message", [
    (5, "row 5 is out of range for a Jagged of 5 rows"),
    (-6, "row -6 is out of range"),
    ([0, 5], "row 5 is out of range"),
    (np.array([True, False]), r"boolean mask of a Jagged's rows must have shape \(5,\)"),
    (np.array([0.5]), "1-D array of ints"),
    (np.array([[0, 1]]), "1-D array of ints"),
    ((0, 1), "one axis of rows"),
])
def test_bad_indices_raise_index_errors(index, message):
    j = Jagged.from_rows([[1], [2, 3], [], [4], [5]])
    with pytest.raises(IndexError, match=message):
        j[index]


@pytest.mark.parametrize("values,offsets,message", [
    (np.arange(3), np.array([0, 3], np.int32), "offsets must be int64, got int32"),
    (np.arange(3), np.array([1, 3]), r"must start at 0, got offsets\[0\] = 1"),
    (np.arange(3), np.array([0, 2, 1, 3]), r"must not decrease, got offsets\[1\] = 2 > offsets\[2\] = 1"),
    (np.arange(3), np.array([0, 2]), r"must end at len\(values\) = 3, got offsets\[-1\] = 2"),
    (np.arange(3), np.array([[0, 3]]), "1-D array of n \\+ 1 positions"),
    (np.arange(3), np.array([], np.int64), "1-D array of n \\+ 1 positions"),
    (np.float32(1), np.array([0, 1]), "values must have a leading axis"),
])
def test_bad_values_or_offsets_raise(values, offsets, message):
    with pytest.raises(ValueError, match=message):
        Jagged(values, offsets)


def test_padded_writes_into_out_and_refuses_a_wrong_one_untouched():
    j = Jagged.from_rows([np.ones((2, 8)), np.ones((0, 8)), np.full((3, 8), 2.0)], dtype=np.float32)
    out = np.full((3, 4, 8), 77.0, np.float32)  # garbage where the padding goes
    got = j.padded(side="left", value=-1, multiple=4, out=out)
    assert got is out
    np.testing.assert_array_equal(out, j.padded(side="left", value=-1, multiple=4))
    assert (out[1] == -1).all()  # the empty row is all padding
    bad = [np.zeros((3, 3, 8), np.float32), np.zeros((3, 4, 8), np.float64), [[0.0]]]
    readonly = np.zeros((3, 4, 8), np.float32)
    readonly.flags.writeable = False
    for wrong in bad:
        before = np.array(wrong, copy=True)
        with pytest.raises(ValueError, match=r"out must be an array of shape \(3, 4, 8\) and dtype float32"):
            j.padded(multiple=4, out=wrong)
        np.testing.assert_array_equal(np.asarray(wrong), before)
    with pytest.raises(ValueError, match="out is read-only"):
        j.padded(multiple=4, out=readonly)
    # a bad argument with a good out: out is not written either
    out[...] = 77.0
    for kwargs in ({"length": 2}, {"side": "middle"}, {"value": np.zeros(3)}):
        with pytest.raises(ValueError):
            j.padded(out=out, **kwargs)
    assert (out == 77.0).all()


@pytest.mark.parametrize("kwargs,error,message", [
    ({"length": 3}, ValueError, r"row 2 has length 4, more than length=3: give length >= 4"),
    ({"length": 6, "multiple": 4}, ValueError, "length=6 is not a multiple of multiple=4"),
    ({"multiple": 0}, ValueError, "multiple must be >= 1, got 0"),
    ({"multiple": 2.0}, TypeError, "multiple must be an integer"),
    ({"length": -1}, ValueError, "length must be >= 0"),
    ({"side": "top"}, ValueError, "side must be 'right' or 'left'"),
])
def test_bad_padding_arguments_raise(kwargs, error, message):
    j = Jagged.from_rows([[1, 2], [], [3, 4, 5, 6]])
    with pytest.raises(error, match=message):
        j.padded(**kwargs)
    with pytest.raises(error, match=message):
        j.mask(**kwargs)


def test_a_padding_value_that_does_not_fit_is_refused():
    j = Jagged.from_rows([[1, 2], [3]], dtype=np.uint8)
    with pytest.raises(ValueError, match="do not fit in uint8"):
        j.padded(value=-1)
    with pytest.raises(TypeError, match="cannot store float64 values in a int32 field"):
        Jagged.from_rows([[1, 2], [3]], dtype=np.int32).padded(value=0.5)
    np.testing.assert_array_equal(j.padded(value=255), [[1, 2], [3, 255]])
    flags = Jagged.from_rows([[True], [False, True]])
    np.testing.assert_array_equal(flags.padded(), [[True, False], [False, True]])  # 0 pads bools
    np.testing.assert_array_equal(flags.padded(value=1, side="left"), [[True, True], [False, True]])
    rows = Jagged.from_rows([np.zeros((1, 2)), np.zeros((2, 2))])
    np.testing.assert_array_equal(rows.padded(value=[7.0, 8.0])[0, 1], [7.0, 8.0])  # per trailing element


def test_cu_seqlens_is_the_offsets_in_int32_and_refuses_more_than_int32_counts():
    j = Jagged.from_rows([[1, 2], [], [3]])
    got = j.cu_seqlens()
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, j.offsets)
    total = 2**31  # more than int32 counts; a broadcast view takes no memory
    big = Jagged(np.broadcast_to(np.zeros(1, np.uint8), (total,)), np.array([0, total]))
    with pytest.raises(ValueError, match=f"the rows hold {total} values, more than int32 offsets count"):
        big.cu_seqlens()
    at_limit = Jagged(np.broadcast_to(np.zeros(1, np.uint8), (total - 1,)), np.array([0, total - 1]))
    assert at_limit.cu_seqlens()[-1] == total - 1


def test_from_rows_infers_casts_and_refuses():
    j = Jagged.from_rows([np.arange(2, dtype=np.int16), [], np.arange(3, dtype=np.int32)])
    assert j.values.dtype == np.int32  # the non-empty rows' common dtype (not the empty row's float64)
    np.testing.assert_array_equal(j.lengths, [2, 0, 3])
    f = Jagged.from_rows([[1.5, 2.5]], dtype=np.float32)
    assert f.values.dtype == np.float32
    none = Jagged.from_rows([], dtype=np.int8, trailing=(4,))
    assert len(none) == 0 and none.values.shape == (0, 4) and none.values.dtype == np.int8
    assert Jagged.from_rows([[], []]).values.shape == (0,)
    with pytest.raises(ValueError, match=r"row 1 has shape \(2, 3\); every row must have shape \(L, \*\(8,\)\)"):
        Jagged.from_rows([np.zeros((1, 8)), np.zeros((2, 3))])
    with pytest.raises(ValueError, match=r"row 0 has shape \(\)"):
        Jagged.from_rows([3.0, [1.0]])
    with pytest.raises(ValueError, match=r"row 0 has shape \(2,\); every row must have shape \(L, \*\(3,\)\)"):
        Jagged.from_rows([[1, 2]], trailing=(3,))
    with pytest.raises(TypeError, match="cannot store float64 values in a int32 field"):
        Jagged.from_rows([[1.5]], dtype=np.int32)
    with pytest.raises(ValueError, match="do not fit in uint8"):
        Jagged.from_rows([[1, 300]], dtype=np.uint8)
    with pytest.raises(ValueError, match="row 1: cannot make an array of it"):
        Jagged.from_rows([[1], [[1, 2], [3]]])


def test_empty_has_the_shape_for_a_reader_to_write():
    j = Jagged.empty(np.array([2, 0, 3], np.int32), np.float32, (8,))
    assert j.values.shape == (5, 8) and j.values.dtype == np.float32
    np.testing.assert_array_equal(j.offsets, [0, 2, 2, 5])
    j.values[...] = 1.5
    np.testing.assert_array_equal(j.padded(), np.where(j.mask()[..., None], np.float32(1.5), np.zeros((3, 3, 8), np.float32)))
    assert len(Jagged.empty([], np.int64)) == 0
    with pytest.raises(ValueError, match=r"lengths\[1\] is -2: a row's length must be >= 0"):
        Jagged.empty([1, -2], np.float32)
    with pytest.raises(ValueError, match="lengths must be integers, got dtype float64"):
        Jagged.empty([1.5], np.float32)
    with pytest.raises(ValueError, match=r"lengths must be a 1-D array of row lengths, got shape \(1, 2\)"):
        Jagged.empty([[1, 2]], np.float32)


def test_helpers_on_lengths():
    lens = np.array([1, 2], np.int64)
    assert as_lengths(lens) is lens  # not copied
    assert as_lengths(np.array([1, 2], np.uint16)).dtype == np.int64
    with pytest.raises(ValueError, match="more than an int64 holds"):
        as_lengths(np.array([2**63], np.uint64))
    assert padded_width([], multiple=8) == 0 and padded_width([9], multiple=8) == 16


def test_repr_is_short():
    assert repr(Jagged.from_rows([[1, 2], [3]], dtype=np.int32)) == "Jagged(n=2, total=3, dtype=int32)"
    assert repr(Jagged.empty([4], np.float32, (8,))) == "Jagged(n=1, total=4, dtype=float32, trailing=(8,))"


def test_to_torch_names_the_extra_when_torch_is_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    with pytest.raises(ImportError, match=r"pip install 'shmbuf\[torch\]'"):
        Jagged.from_rows([[1.0]]).to_torch()


@pytest.mark.extras
@pytest.mark.parametrize("trailing", [(), (8,)])
def test_to_torch_is_a_jagged_nested_tensor_over_the_same_memory(trailing):
    torch = pytest.importorskip("torch", reason="torch is an optional extra: pip install torch==2.13.0")
    rng = np.random.default_rng(5)
    rows = random_rows(rng, 6, trailing, np.float32)
    rows[2] = rows[2][:0]
    j = Jagged.from_rows(rows, dtype=np.float32, trailing=trailing)
    t = j.to_torch()
    assert t.is_nested and t.layout == torch.jagged and t.shape[0] == 6
    np.testing.assert_array_equal(t.offsets().numpy(), j.offsets)
    assert t.offsets().dtype == torch.int64
    for i, row in enumerate(rows):
        np.testing.assert_array_equal(t[i].numpy(), row)
    j.values[...] = 123.0  # no copy: the tensor sees the change
    assert (t.values() == 123.0).all()
    assert t.values().data_ptr() == j.values.ctypes.data
    assert t.offsets().data_ptr() == j.offsets.ctypes.data


@pytest.mark.extras
def test_to_torch_of_read_only_values_shares_them_without_a_warning():
    """Values in read-only memory (an Arrow batch's, a memory map's): the tensor is over
    the same memory, and torch's warning about it (an error under the suite's filters)
    is not raised."""
    pytest.importorskip("torch", reason="torch is an optional extra: pip install torch==2.13.0")
    values = np.arange(5, dtype=np.int32)
    values.flags.writeable = False
    t = Jagged(values, np.array([0, 2, 5])).to_torch()
    assert t.values().data_ptr() == values.ctypes.data and t[1].tolist() == [2, 3, 4]
