"""The learner's side of shmbuf.ray without Ray: a ShardedBuffer over real shmbuf
buffers (one per shard, in this process), its shard actors the real shard code
(``shmbuf.ray.shard.Shard``'s methods) called at once, and Ray's ``get``/``wait`` a
stand-in that hands their answers back. What is checked here is the learner's
arithmetic and order of calls: the per-shard draw, and the checks that come before
any shard is asked to change anything. The cluster itself: tests/ray/test_ray.py."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import shmbuf
from shmbuf.priority.trees import LARGEST, largest_leaf
from shmbuf.ray import calls, sharded, takes
from shmbuf.ray.calls import Shard, shares, split_updates
from shmbuf.ray.shard import Shard as ShardActor
from shmbuf.ray.sharded import ShardedBuffer

X = {"x": ((), "float32")}


class Ref:
    """A call made at once: its answer, or the error it raised (``silent``: a call that
    never answers, as a dead or cut-off node's)."""

    silent = False

    def __init__(self, fn: Any, *args: Any) -> None:
        try:
            self.value, self.error = fn(*args), None
        except Exception as exc:
            self.value, self.error = None, exc


class RayTaskError(Exception):
    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


class FakeRay:
    """What ShardCalls uses of Ray: ``wait`` (every call has answered) and ``get`` (a
    shard's own error comes as Ray's RayTaskError, with the error as its ``cause``)."""

    class exceptions:
        RayError = Exception
        RayTaskError = RayTaskError

    @staticmethod
    def wait(refs: list, num_returns: int = 1, timeout: float | None = None) -> tuple[list, list]:
        return [r for r in refs if not r.silent], [r for r in refs if r.silent]

    @staticmethod
    def get(ref: Any, timeout: float | None = None) -> Any:
        if isinstance(ref, list):
            return [FakeRay.get(r) for r in ref]
        if ref.error is not None:
            raise RayTaskError(ref.error)
        return ref.value


class Actor:
    """A shard actor's handle: ``actor.method.remote(...)`` runs the real shard method
    now; the calls are counted by method. Calls of the methods in ``silent`` never answer."""

    def __init__(self, buf: shmbuf.Buffer, silent: tuple = ()) -> None:
        self.shard = ShardActor.__new__(ShardActor)
        self.shard.error, self.shard.buf, self.shard.core = None, buf, buf
        self.shard.segment, self.shard.kind, self.shard.node = buf.name, "buffer", "node"
        self.calls: dict[str, int] = {}
        self.silent = set(silent)

    def __getattr__(self, method: str) -> Any:
        actor = self

        class Method:
            @staticmethod
            def remote(*args: Any) -> Ref:
                actor.calls[method] = actor.calls.get(method, 0) + 1
                if method in actor.silent:
                    ref = Ref(lambda: None)
                    ref.silent = True
                    return ref
                return Ref(getattr(actor.shard, method), *args)
        return Method


@pytest.fixture
def no_ray(monkeypatch):
    monkeypatch.setattr(calls, "ray_module", lambda: FakeRay)
    monkeypatch.setattr(sharded, "ray_module", lambda: FakeRay)
    monkeypatch.setattr(takes, "ray_module", lambda: FakeRay)


@pytest.fixture
def shards(name):
    """``make(alphas, capacity)``: prioritized buffers, one per alpha, named
    ``<name>.<i>``; closed and removed at the end."""
    made: list[shmbuf.Buffer] = []

    def make(alphas: list[float], capacity: int = 8) -> list[shmbuf.Buffer]:
        for a in alphas:
            made.append(shmbuf.Buffer.create(X, capacity, priority=a, seed=len(made), name=f"{name}.{len(made)}",
                                              timeout=5.0))
        return made[-len(alphas):]
    yield make
    for b in made:
        b.unlink()
        b.close()


def sharded_over(bufs: list[shmbuf.Buffer], seen: bool = True, silent: tuple = ()) -> tuple[ShardedBuffer, list[Actor]]:
    """A ShardedBuffer over ``bufs`` (their figures known if ``seen``, as after create;
    ``silent``: the shard methods that never answer)."""
    actors = [Actor(b, silent) for b in bufs]
    table = [Shard(i, "node", b.name, a) for i, (b, a) in enumerate(zip(bufs, actors))]
    if seen:
        for s, a in zip(table, actors):
            s.take(a.shard.info())
    return ShardedBuffer("sharded", "buffer", True, table, seed=0, timeout=5.0), actors


def masses(bufs: list[shmbuf.Buffer]) -> list[float]:
    return [b.engine.priorities.totals(5.0)[0] for b in bufs]


# -- the draw across shards --------------------------------------------------------------

def test_shares_are_the_masses_over_their_sum_even_when_the_sum_is_not_finite():
    assert shares(np.array([3.0, 1.0, 0.0])).tolist() == [0.75, 0.25, 0.0]
    assert shares(np.array([LARGEST, LARGEST / 2, LARGEST / 4])) == pytest.approx([4 / 7, 2 / 7, 1 / 7])
    assert shares(np.array([0.0, 0.0])) is None and shares(np.array([])) is None


def test_shards_whose_masses_are_each_near_their_bound_are_drawn_evenly(shards, no_ray):
    """Three shards, each full of rows at the largest p**a its trees hold (mass: the
    largest float64, finite); their sum is infinite. Before: every share 0, and all
    3000 rows from the last shard."""
    bufs = shards([1.0, 1.0, 1.0])
    for b in bufs:
        b.extend({"x": np.arange(8, dtype=np.float32)}, priority=largest_leaf(8))
    m = masses(bufs)
    assert all(np.isfinite(m)) and min(m) > LARGEST / 2 and sum(m) == float("inf")  # (Python floats: no warning)
    rb, _ = sharded_over(bufs)
    batch = rb.sample(3000, beta=0.4)
    per = np.bincount(batch["shard"], minlength=3)
    assert per.sum() == 3000 and (abs(per - 1000) < 150).all(), per
    assert np.allclose(batch["weight"], 1.0)


# -- priority updates: checked against every shard before any changes ---------------------

def test_a_priority_past_one_shards_bound_sets_none_on_any_shard(shards, no_ray):
    """Shard 0 (a = 1) gets a good priority, shard 1 (a = 2) one whose p**a is past its
    bound (the same priority is within shard 0's). Before: shard 0 set its rows, then
    shard 1 refused."""
    bufs = shards([1.0, 2.0])
    for b in bufs:
        b.extend({"x": np.arange(8, dtype=np.float32)}, priority=1.0)
    rb, actors = sharded_over(bufs)
    big = 2 * np.sqrt(largest_leaf(8))  # big**2 is past the bound of shard 1, big is far within shard 0's
    index = np.array([[0, 0, 0], [0, 1, 1], [1, 2, 2]])
    before = masses(bufs)
    with pytest.raises(ValueError) as refused:
        rb.update_priorities(index, [5.0, 5.0, big])
    assert masses(bufs) == before
    assert [a.calls.get("update_priorities", 0) for a in actors] == [0, 0]
    assert refused.match(r"update_priorities \(shard 1; no priority was set\): p\*\*a must be at most .* in a "
                         r"buffer of 8 rows .* with a = 2: pass priorities <=")
    with pytest.raises(ValueError) as refused:  # a slot past shard 1's capacity
        rb.update_priorities(index + [[0, 0, 0], [0, 0, 0], [0, 6, 0]], [5.0, 5.0, 5.0])
    assert masses(bufs) == before
    assert [a.calls.get("update_priorities", 0) for a in actors] == [0, 0]
    assert refused.match(r"the slots of shard 1 must be in \[0, 8\) \(its capacity\), got \[8\]")
    assert rb.update_priorities(index, [5.0, 5.0, big / 2]) == 3  # (big/2)**2: at the bound, taken
    assert masses(bufs) == pytest.approx([before[0] + 8.0, before[1] - 1 + largest_leaf(8)])


def test_a_copy_that_has_not_seen_its_shards_asks_their_bounds_first(shards, no_ray):
    """A ShardedBuffer unpickled in a task knows no shard's capacity or exponent yet: it
    asks them (one info call each shard concerned) before it checks and sends."""
    bufs = shards([1.0, 1.0])
    for b in bufs:
        b.extend({"x": np.arange(8, dtype=np.float32)}, priority=1.0)
    rb, actors = sharded_over(bufs, seen=False)
    before = masses(bufs)
    with pytest.raises(ValueError) as refused:
        rb.update_priorities(np.array([[0, 0, 0], [1, 0, 0]]), [2.0, 2 * largest_leaf(8)])
    assert masses(bufs) == before
    assert refused.match(r"shard 1; no priority was set\): p\*\*a must be at most")
    assert [a.calls for a in actors] == [{"info": 1}, {"info": 1}]


def test_split_updates_checks_the_rows_of_shards_that_are_down_and_sends_them_nowhere(shards):
    bufs = shards([1.0, 1.0])
    table = [Shard(i, "node", b.name, None) for i, b in enumerate(bufs)]
    for s, b in zip(table, bufs):
        s.take(Actor(b).shard.info())
    table[1].up = False
    idx, p = np.array([[0, 3, 3], [1, 4, 4]]), np.array([1.0, 2.0])
    parts = split_updates(table, idx, p)
    assert [(s.index, rows.tolist(), q.tolist()) for s, rows, q in parts] == [(0, [[3, 3]], [1.0])]
    with pytest.raises(ValueError, match=r"shard 1; no priority was set"):
        split_updates(table, idx, np.array([1.0, 2 * largest_leaf(8)]))
    never = Shard(1, None, "never", None)  # attached as down, never answered: its bounds are not known
    never.up = False
    assert [s.index for s, _, _ in split_updates([table[0], never], idx, np.array([1.0, 1e308]))] == [0]


# -- faults ------------------------------------------------------------------------------

def test_shards_all_dropped_as_their_sizes_are_asked_are_unavailable_not_empty(shards, no_ray):
    """Every shard was empty when last seen, so the draw asks their sizes again; none
    answers (each is dropped, with a ShardWarning): ShardsUnavailable, as for shards
    that are down. Before: 'cannot sample from an empty buffer' (a ValueError), which
    says the rows are not there when what is not there is an answer."""
    bufs = shards([1.0, 1.0])
    rb, actors = sharded_over(bufs, silent=("info",))
    with pytest.warns(calls.ShardWarning, match="dropped from sampling"):
        with pytest.raises(calls.ShardsUnavailable, match=r"no shard of 'sharded' answered within .* asked for "
                                                          r"its size \(shards up: \[\], down: \[0, 1\]\)"):
            rb.sample(4, beta=0.4, timeout=1.0)
    assert [a.calls.get("info", 0) for a in actors] == [1, 1] and not any(s["up"] for s in rb.shards)


class FakeRuntime:
    was_current_actor_reconstructed = False

    @staticmethod
    def get_node_id() -> str:
        return "node"


@pytest.mark.parametrize("asked, found", [(0.7, 0.6), (None, 0.6), (0.6, None)])
def test_a_shard_taken_over_with_another_priority_exponent_is_refused(name, monkeypatch, asked, found):
    """create(..., exist_ok=True) over a shard left by an earlier run with the same fields
    and capacity but another exponent (or none, or one where none is asked): the shard's
    error says so (it took the shard over, and the cluster's draw mixed exponents)."""
    import sys
    import types
    fake = types.SimpleNamespace(get_runtime_context=lambda: FakeRuntime)
    monkeypatch.setitem(sys.modules, "ray", fake)
    left = shmbuf.Buffer.create(X, 8, name=f"{name}.0", priority=found, seed=0)
    try:
        shard = ShardActor(f"{name}.0", "buffer", X, 8, {"priority": asked}, 0, True, None)
        with pytest.raises(ValueError, match=r"the existing shard .* has (priority exponent 0\.6|no priorities), "
                                              r"not (priority exponent 0\.[67]|no priorities) as asked"):
            shard.info()
        same = ShardActor(f"{name}.0", "buffer", X, 8, {"priority": found}, 0, True, None)
        assert same.info()["alpha"] == found  # (the same exponent: taken over)
        same.buf.close()
    finally:
        left.unlink()
        left.close()


# -- ragged rows: one Jagged per field, token budgets split over the shards ---------------

TOKENS = {"r": (("R",), np.int64), "lp": (("R",), np.float32), "p": ((None,), np.int32), "k": ((), np.int64)}


def ragged_rows(shard: int, keys: Any, rng: np.random.Generator) -> dict[str, Any]:
    """Rows whose every value tells its row: ``k`` = shard * 10**6 + key, ``r`` of a random
    length 1..40, each value ``k``; ``lp`` its ``-k``; ``p`` 0..3 values ``k``."""
    k = shard * 10**6 + np.asarray(keys, np.int64)
    lens = rng.integers(1, 41, len(k))
    return {"k": k, "r": [np.full(n, x) for n, x in zip(lens, k)],
            "lp": [np.full(n, -x, np.float32) for n, x in zip(lens, k)],
            "p": [np.full(x % 4, x, np.int32) for x in k]}


def ragged_errors(b: dict[str, Any]) -> int:
    """Rows whose ragged values are not their own (``k``'s), or whose fields disagree."""
    bad = 0
    for i, k in enumerate(b["k"].tolist()):
        r, lp, p = b["r"][i], b["lp"][i], b["p"][i]
        bad += not (len(r) == len(lp) and (r == k).all() and (lp == -k).all() and len(p) == k % 4 and (p == k).all())
    return bad


def _shards(name: str, seed: int, **create: Any):
    """A fixture's ``make(rows, **options)``: ragged buffers (``create``: the keywords they
    share), shard ``i`` holding ``rows[i]`` rows (versions 0, 1, ... of 16 rows each with
    ``versions=True``); removed after the test."""
    made: list[shmbuf.Buffer] = []

    def make(rows: list[int], **options: Any) -> list[shmbuf.Buffer]:
        rng = np.random.default_rng(seed)
        for i, n in enumerate(rows):
            b = shmbuf.Buffer.create(TOKENS, arena=1 << 20, name=f"{name}.{i}", timeout=5.0,
                                     **({"seed": i} if create.get("mode") != "queue" else {}), **create, **options)
            for v, at in enumerate(range(0, n, 16)):
                extra = {"version": v} if options.get("versions") else {}
                b.extend(ragged_rows(i, np.arange(at, min(n, at + 16)), rng), **extra)
            made.append(b)
        return made[-len(rows):]
    yield make
    for b in made:
        b.unlink()
        b.close()


@pytest.fixture
def ragged_shards(name):
    yield from _shards(name, 0, capacity=256)


def ragged_over(bufs: list[shmbuf.Buffer]) -> ShardedBuffer:
    table = [Shard(i, "node", b.name, Actor(b)) for i, b in enumerate(bufs)]
    for s in table:
        s.take(s.actor.shard.info())
    return ShardedBuffer("sharded", "buffer", False, table, seed=0, timeout=5.0)


def test_a_jagged_pickles_as_its_two_arrays_out_of_band():
    """Ray pickles a batch with protocol 5 and sends the buffers it is given out of band:
    a Jagged gives its values and offsets (not a row list; no copy into the pickle)."""
    import pickle
    j = shmbuf.Jagged.from_rows([np.arange(1000), np.arange(3)], dtype=np.int64)
    buffers: list = []
    data = pickle.dumps(j, protocol=5, buffer_callback=buffers.append)
    assert len(buffers) == 2 and len(data) < 400
    back = pickle.loads(data, buffers=buffers)
    assert back.offsets.tolist() == [0, 1000, 1003] and (back.values == j.values).all()


def test_ragged_shards_give_one_jagged_per_field_of_their_rows(ragged_shards, no_ray):
    rb = ragged_over(ragged_shards([100, 60]))
    b = rb.sample(500)
    assert isinstance(b["r"], shmbuf.Jagged) and len(b["r"]) == len(b["p"]) == len(b["k"]) == 500
    assert ragged_errors(b) == 0 and set(b["shard"].tolist()) == {0, 1}
    assert ((b["k"] // 10**6) == b["shard"]).all()
    assert 0 < (b["shard"][:250] == 0).mean() < 1  # (the shards' rows mixed, not one block after the other)
    empty = rb.sample(0)
    assert len(empty["r"]) == 0 and empty["r"].values.dtype == np.int64 and empty["p"].values.dtype == np.int32


def test_a_token_budget_over_shards_never_passes_its_total(ragged_shards, no_ray):
    """Two shards (100 and 60 rows of 1..40 tokens): a budget of T tokens gives rows of
    both shards whose lengths add up to at most T, at least one row, never more than n;
    the rows are whole (values of their own row). Their count is about what one buffer's
    budget gives (T over the mean length)."""
    bufs = ragged_shards([100, 60])
    rb = ragged_over(bufs)
    mean = np.mean(np.concatenate([b.sample(2000)["r"].lengths for b in bufs]))
    counts = []
    for T in [1, 5, 39, 40, 41, 200, 1000, 5000]:
        for _ in range(20):
            b = rb.sample(max_tokens=T, length="R")
            total = int(b["r"].lengths.sum())
            assert len(b["k"]) >= 1 and (total <= T or len(b["k"]) == 1), (T, total, len(b["k"]))
            assert ragged_errors(b) == 0 and b["lp"].lengths.tolist() == b["r"].lengths.tolist()
            assert "_tokens" not in b
            if T == 5000:
                counts.append(len(b["k"]))
    assert abs(np.mean(counts) - 5000 / mean) < 0.15 * 5000 / mean, (np.mean(counts), 5000 / mean)
    for _ in range(20):
        b = rb.sample(7, max_tokens=1000, length="R")
        assert len(b["k"]) == 7
        b = rb.sample(max_tokens=100, length="p")  # (a field of its own length)
        assert b["p"].lengths.sum() <= 100 or len(b["k"]) == 1


def test_a_bad_token_budget_is_refused_before_any_shard_is_asked(ragged_shards, no_ray):
    bufs = ragged_shards([10, 10])
    rb = ragged_over(bufs)
    before = rb._rng.bit_generator.state
    for kwargs, match in [({"max_tokens": 10, "length": "Q"}, r"length='Q' names no ragged field or length of "
                                                                r"this buffer; it has \['R', 'lp', 'p', 'r'\]"),
                          ({"max_tokens": 10}, "takes both max_tokens= and length="),
                          ({"length": "R"}, "takes both max_tokens= and length="),
                          ({"max_tokens": 0, "length": "R"}, "max_tokens")]:
        with pytest.raises(ValueError, match=match):
            rb.sample(**kwargs)
    assert rb._rng.bit_generator.state == before
    assert [s.actor.calls.get("sample", 0) for s in rb._shards] == [0, 0]


@pytest.fixture
def queue_shards(name):
    """Ragged queues (see :func:`_shards`)."""
    yield from _shards(name, 1, capacity=512, mode="queue")


def test_a_take_over_queue_shards_delivers_every_row_once_within_its_budget(queue_shards, no_ray):
    """Two queue shards (100 and 60 rows of 1..40 tokens): takes with a budget of T
    tokens each return at most T tokens (or one row), whole rows in each shard's order;
    every row is delivered once: the rows past a take's budget are held and returned
    first by the next take, none is lost or repeated."""
    bufs = queue_shards([100, 60])
    rb = ragged_over(bufs)
    seen: list[int] = []
    for T in [1, 30, 100, 300, 1000] * 6:
        try:
            b = rb.take(64, partial=True, max_tokens=T, length="R", timeout=0.5)
        except shmbuf.SampleTimeout:
            break
        total = int(b["r"].lengths.sum())
        assert 1 <= len(b["k"]) <= 64 and (total <= T or len(b["k"]) == 1), (T, total)
        assert ragged_errors(b) == 0 and ((b["k"] // 10**6) == b["shard"]).all()
        seen += b["k"].tolist()
    want = sorted([10**6 * 0 + k for k in range(100)] + [10**6 + k for k in range(60)])
    assert sorted(seen) == want and len(seen) == len(set(seen))
    for i in (0, 1):  # (each shard's rows in their order)
        mine = [k for k in seen if k // 10**6 == i]
        assert mine == sorted(mine)
    assert [len(b) for b in bufs] == [0, 0] and rb._held == []


def test_a_take_of_n_rows_gathers_them_over_shards_and_times_out_holding_what_it_took(queue_shards, no_ray):
    bufs = queue_shards([20, 5])
    rb = ragged_over(bufs)
    b = rb.take(25)
    assert len(b["k"]) == 25 and ragged_errors(b) == 0 and sorted(b["k"].tolist()) == sorted(
        list(range(20)) + [10**6 + k for k in range(5)])
    bufs[1].extend(ragged_rows(1, [5, 6], np.random.default_rng(0)))
    with pytest.raises(shmbuf.SampleTimeout, match=r"could not take 3 row\(s\) within 0.3 s .* \(2 taken, held"):
        rb.take(3, timeout=0.3)
    assert rb.take(3, partial=True)["k"].tolist() == [10**6 + 5, 10**6 + 6]  # (held: not lost)


def test_a_take_by_staleness_is_bounded_by_the_clusters_newest_version(queue_shards, no_ray):
    """Shard 0 holds versions 0..3, shard 1 versions 0..1 (16 rows each): max_staleness=1
    counts from the cluster's newest (3), so shard 1's rows are all passed over, and
    shard 0's of versions 0, 1; a held row that the next take's bound passes over is
    dropped."""
    bufs = queue_shards([64, 32], versions=True)
    rb = ragged_over(bufs)
    b = rb.take(100, partial=True, max_staleness=1, max_tokens=10**6, length="R")
    assert set(b["version"].tolist()) == {2, 3} and set(b["shard"].tolist()) == {0}
    assert len(b["k"]) == 32 and ragged_errors(b) == 0
    assert [x.stats()["rows_stale"] for x in bufs] == [32, 32]
    bufs[1].extend(ragged_rows(1, np.arange(100, 104), np.random.default_rng(0)), version=5)
    bufs[1].extend(ragged_rows(1, np.arange(104, 108), np.random.default_rng(0)), version=9)
    with pytest.raises(shmbuf.SampleTimeout, match=r"\(8 taken, held for the next take"):
        rb.take(10, max_staleness=10, timeout=0.3)
    b = rb.take(10, partial=True, max_staleness=0)  # (the newest: 9, of the rows held)
    assert b["version"].tolist() == [9] * 4 and rb._held == []  # (the held rows of version 5: passed over)


def test_take_from_replay_shards_is_refused_before_any_is_asked(ragged_shards, no_ray):
    rb = ragged_over(ragged_shards([10]))
    with pytest.raises(ValueError, match="take\\(\\) is for a queue"):
        rb.take(4)
    with pytest.raises(ValueError, match="names no ragged field"):
        rb.take(4, max_tokens=5, length="Q")
    assert rb._shards[0].actor.calls.get("take", 0) == 0


def test_rows_held_by_a_take_without_a_budget_are_cut_by_the_next_takes_budget(queue_shards, no_ray):
    """A take of 11 rows times out holding the 10 there are; the next take, with a
    budget of the first three rows' tokens, returns those three (its budget counts the
    held rows' own lengths), the next the other seven. Before: a KeyError (the held rows
    had no lengths sent with them)."""
    bufs = queue_shards([10, 0])
    rb = ragged_over(bufs)
    with pytest.raises(shmbuf.SampleTimeout, match=r"\(10 taken, held"):
        rb.take(11, timeout=0.3)
    held = rb._held[0][1]["r"].lengths
    b = rb.take(64, partial=True, max_tokens=int(held[:3].sum()), length="R")
    assert b["k"].tolist() == [0, 1, 2] and ragged_errors(b) == 0
    assert rb.take(64, partial=True)["k"].tolist() == list(range(3, 10)) and rb._held == []


def test_a_ragged_shard_restarted_or_taken_over_attaches_its_rows(name, monkeypatch):
    """A shard actor restarted by Ray (or create(exist_ok=True)) over a ragged shard's
    segment attaches it with its rows: its schema is compared as the buffer spells it.
    Before: normalize_fields refused the (None,)/("R",) shapes, and the shard reported
    that error."""
    import sys
    import types
    monkeypatch.setitem(sys.modules, "ray", types.SimpleNamespace(get_runtime_context=lambda: FakeRuntime))
    left = shmbuf.Buffer.create(TOKENS, 8, name=f"{name}.0", arena=1 << 16, persist=True)
    try:
        left.extend(ragged_rows(0, [1, 2, 3], np.random.default_rng(0)))
        shard = ShardActor(f"{name}.0", "buffer", TOKENS, 8, {"arena": 1 << 16}, 0, True, None)
        assert shard.info()["size"] == 3 and ragged_errors(shard.sample(("sample", 4, (), {}))[0]) == 0
        shard.buf.close()
        other = ShardActor(f"{name}.0", "buffer", {**TOKENS, "r": ((None,), np.int64)}, 8, {"arena": 1 << 16}, 0,
                           True, None)
        with pytest.raises(ValueError, match="the existing shard .* holds 8 rows of"):
            other.info()
    finally:
        left.unlink()
        left.close()
