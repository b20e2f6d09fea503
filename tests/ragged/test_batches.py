"""shmbuf.ragged.batches: token budgets, balanced micro-batches, length buckets, select,
padding; checked against plain Python references. Pure numpy: the same on both paths."""

from __future__ import annotations

import numpy as np
import pytest

from shmbuf.ragged.batches import balanced, budget, buckets, padding, select
from shmbuf.ragged.jagged import Jagged

pytestmark = pytest.mark.one_path


def random_lengths(seed: int, n: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    lens = rng.integers(1, 200, n)
    lens[rng.random(n) < 0.1] = 0
    return lens.astype(np.int64)


def test_budget_edge_cases():
    assert budget([3, 4, 5], 7) == 2  # 3 + 4 fits exactly
    assert budget([3, 4, 5], 6) == 1
    assert budget([3, 4, 5], 12) == 3 and budget([3, 4, 5], 10**9) == 3
    assert budget([100, 1, 1], 5) == 1  # the first row alone is over the budget: taken alone
    assert budget([0, 0, 5, 0], 5) == 4  # empty rows cost nothing
    assert budget([], 5) == 0
    assert budget(np.array([2, 2], np.int32), np.int64(4)) == 2


def test_budget_matches_a_python_reference():
    for seed in range(20):
        lens = random_lengths(seed, 50)
        for max_tokens in (1, 50, 199, 1000, 5000):
            taken = total = 0
            for length in lens:
                if total + length > max_tokens and taken:
                    break
                taken, total = taken + 1, total + length
            assert budget(lens, max_tokens) == taken


@pytest.mark.parametrize("max_tokens,error,message", [
    (0, ValueError, "max_tokens must be >= 1, got 0"),
    (2.5, TypeError, "max_tokens must be an integer"),
    (True, TypeError, "max_tokens must be an integer"),
])
def test_budget_refuses_bad_budgets(max_tokens, error, message):
    with pytest.raises(error, match=message):
        budget([1, 2], max_tokens)


def reference_balanced(lens, k):
    order = sorted(range(len(lens)), key=lambda i: (-lens[i], i))
    sums, parts = [0] * k, [[] for _ in range(k)]
    for i in order:
        b = min(range(k), key=lambda b: (sums[b], b))
        sums[b] += lens[i]
        parts[b].append(i)
    return [sorted(p) for p in parts]


@pytest.mark.parametrize("k", [1, 2, 3, 8])
def test_balanced_parts_cover_every_row_once_and_are_even(k):
    for seed in range(30):
        lens = random_lengths(seed, int(np.random.default_rng(seed).integers(0, 60)))
        parts = balanced(lens, k)
        assert len(parts) == k
        assert all(np.all(np.diff(p) > 0) for p in parts)  # ascending
        assert sorted(np.concatenate(parts).tolist()) == list(range(len(lens)))  # each exactly once
        sums = [int(lens[p].sum()) for p in parts]
        longest = int(lens.max()) if lens.size else 0
        assert max(sums) <= lens.sum() / k + longest
        assert [p.tolist() for p in parts] == reference_balanced(lens.tolist(), k)
        assert [p.tolist() for p in balanced(lens, k)] == [p.tolist() for p in parts]  # deterministic


def test_balanced_gives_an_even_split_where_one_exists_and_empty_parts_for_few_rows():
    parts = balanced([4, 4, 2, 2, 2, 2], 2)
    assert [int(np.take([4, 4, 2, 2, 2, 2], p).sum()) for p in parts] == [8, 8]
    parts = balanced([5, 7], 4)
    assert [p.tolist() for p in parts] == [[1], [0], [], []]
    assert [p.tolist() for p in balanced([], 3)] == [[], [], []]


def test_buckets_group_by_the_first_bound_that_holds_the_length():
    lens = random_lengths(1, 300)
    bounds = [0, 16, 64, 128, 256]
    groups = buckets(lens, bounds)
    assert len(groups) == len(bounds)
    for b, group in enumerate(groups):
        want = [i for i, length in enumerate(lens) if length <= bounds[b] and (b == 0 or length > bounds[b - 1])]
        assert group.tolist() == want
    assert buckets([], [8])[0].tolist() == []


@pytest.mark.parametrize("lengths,bounds,message", [
    ([4, 9, 20], [8, 16], "row 2 has length 20, more than the last bound 16: add a bound >= 20"),
    ([4], [16, 8], r"bounds must be strictly ascending, got \[16, 8\]"),
    ([4], [8, 8], "strictly ascending"),
    ([4], [], "bounds must hold at least one length"),
    ([4], [-1, 8], r"bounds\[0\] is -1"),
    ([4.5], [8], "lengths must be integers, got dtype float64"),
    ([[4]], [8], "lengths must be a 1-D array"),
])
def test_buckets_refuse_bad_inputs_and_change_nothing(lengths, bounds, message):
    lens, bnds = np.array(lengths), np.array(bounds)
    before = lens.copy(), bnds.copy()
    with pytest.raises(ValueError, match=message):
        buckets(lens, bnds)
    np.testing.assert_array_equal(lens, before[0])
    np.testing.assert_array_equal(bnds, before[1])


def test_select_takes_positions_in_order_from_every_field():
    rows = [[1, 2], [3], [], [4, 5, 6]]
    batch = {"tokens": Jagged.from_rows(rows, dtype=np.int32), "reward": np.arange(4.0),
             "obs": np.arange(8).reshape(4, 2)}
    part = select(batch, [3, -4, 2])
    assert set(part) == set(batch)
    np.testing.assert_array_equal(part["reward"], [3.0, 0.0, 2.0])
    np.testing.assert_array_equal(part["obs"], [[6, 7], [0, 1], [4, 5]])
    assert isinstance(part["tokens"], Jagged)
    assert [part["tokens"][i].tolist() for i in range(3)] == [[4, 5, 6], [1, 2], []]
    empty = select(batch, [])
    assert len(empty["tokens"]) == 0 and empty["obs"].shape == (0, 2)
    # micro-batches of a batch: every row in exactly one
    parts = [select(batch, p) for p in balanced(batch["tokens"].lengths, 2)]
    assert sorted(r for p in parts for r in p["reward"].tolist()) == [0.0, 1.0, 2.0, 3.0]


@pytest.mark.parametrize("batch,positions,error,message", [
    ({"a": np.arange(3)}, [3], IndexError, "position 3 is out of range for a batch of 3 rows"),
    ({"a": np.arange(3)}, [-4], IndexError, "position -4 is out of range"),
    ({"a": np.arange(3)}, [0.5], ValueError, "positions must be a 1-D array of ints"),
    ({"a": np.arange(3)}, [True], ValueError, "positions must be a 1-D array of ints"),
    ({"a": np.arange(3), "b": np.arange(2)}, [0], ValueError, "different numbers of rows: {'a': 3, 'b': 2}"),
    ({"a": [1, 2]}, [0], TypeError, "field 'a' is a list: select takes ndarray fields"),
    ({"a": np.float32(1)}, [0], TypeError, "field 'a' is a float32"),
    ({"a": np.array(1.0)}, [0], TypeError, "field 'a' is a 0-d ndarray"),
    ([np.arange(3)], [0], TypeError, "batch must be a mapping"),
])
def test_select_refuses_bad_inputs(batch, positions, error, message):
    with pytest.raises(error, match=message):
        select(batch, positions)


def test_padding_is_the_share_of_padding_in_the_padded_batch():
    for seed in range(10):
        lens = random_lengths(seed, 20)
        j = Jagged.empty(lens, np.int8)
        for multiple in (1, 8, 64):
            assert padding(lens, multiple) == pytest.approx(1.0 - j.mask(multiple=multiple).mean())
    assert padding([]) == 0.0 and padding([0, 0]) == 0.0
    assert padding([5, 5, 5]) == 0.0

