"""shmbuf.ray.ShardedBuffer on a real multi-node Ray cluster on this machine
(``ray.cluster_utils.Cluster``: a head and two more nodes, each its own raylet and object
store). scripts/test-ray runs this file in a virtualenv with Ray pinned.

Every shard actor, writer task and driver here is a real process; the faults are real
signals sent to the shard actor's process (SIGKILL: Ray restarts it; SIGSTOP: it is
alive but silent)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest

import shmbuf
from shmbuf.core import native as native_path
from shmbuf.core import segment
from shmbuf.priority.trees import largest_leaf

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: E402

import helpers  # noqa: E402
from shmbuf.ray import ShardedBuffer, ShardsUnavailable, ShardWarning  # noqa: E402

pytestmark = pytest.mark.ray
TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/ (helpers.py)
FIELDS = helpers.STORM


@pytest.fixture(scope="module")
def cluster():
    """Three nodes; the suite's namespace and tests/ reach every worker through the
    raylets' environment."""
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (TESTS, old) if p)
    store = 80 * 2**20
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "object_store_memory": store})
    for _ in range(2):
        c.add_node(num_cpus=2, object_store_memory=store)
    ray.init(address=c.address, logging_level="ERROR", log_to_driver=False)
    c.wait_for_nodes()
    try:
        yield c
    finally:
        ray.shutdown()
        c.shutdown()
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old


@pytest.fixture
def nodes(cluster):
    return [n["NodeID"] for n in ray.nodes() if n["Alive"]]


def on(node: str, fn, **options):
    """``fn`` (a remote function) to run on ``node``, taking no CPU."""
    return fn.options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False), **options)


@ray.remote
def storm_writer(rb: ShardedBuffer, writer: int, seconds: float, chunk: int = 64) -> tuple[str, int]:
    """Write storm rows into this node's shard for ``seconds``: (node, rows written)."""
    seq, deadline = 0, time.monotonic() + seconds
    with rb.local() as local:
        while time.monotonic() < deadline:
            local.extend(helpers.storm_rows(writer, np.arange(seq, seq + chunk)))
            seq += chunk
    return ray.get_runtime_context().get_node_id(), seq


@ray.remote
def write_rows(rb: ShardedBuffer, writer: int, rows: int, priority: float | None = None) -> int:
    with rb.local() as local:
        extra = {} if priority is None else {"priority": priority}
        local.extend(helpers.storm_rows(writer, np.arange(rows)), **extra)
        return len(local)


@ray.remote
def sample_in_a_task(rb: ShardedBuffer, n: int) -> dict:
    return rb.sample(n)


@ray.remote
def try_local(rb: ShardedBuffer) -> str:
    try:
        rb.local()
    except RuntimeError as exc:
        return str(exc)
    return "no error"


def shard_pid(rb: ShardedBuffer, i: int) -> int:
    return ray.get(rb._shards[i].actor.pid.remote(), timeout=30)


def shm_segments(name: str) -> list[str]:
    return sorted(n for n in segment.list_names() if n.startswith(name + "."))


def wait_until_up(rb: ShardedBuffer, i: int, seconds: float = 60) -> list[str]:
    """Sample until shard ``i`` is back; the warnings seen meanwhile."""
    deadline = time.monotonic() + seconds
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", ShardWarning)
        while not rb.shards[i]["up"]:
            assert time.monotonic() < deadline, f"shard {i} did not come back: {rb.shards}"
            time.sleep(0.2)
            rb.sample(8, timeout=5)
    return [str(w.message) for w in seen]


# -- writing and sampling ----------------------------------------------------------------

def test_writers_on_every_node_and_a_learner_see_no_torn_row(nodes, name):
    """Two writer tasks per node write into their node's shard while the learner samples
    from all shards: every row of every batch intact, rows from every shard, and the
    shard proportions those of the shard sizes."""
    with ShardedBuffer.create(FIELDS, 4096, name=name, seed=1) as rb:
        assert len(rb.shards) == 3 and shm_segments(name) == [f"{name}.0", f"{name}.1", f"{name}.2"]
        refs = [on(node, storm_writer).remote(rb, 10 * i + w, 2.0) for i, node in enumerate(nodes) for w in range(2)]
        torn = batches = 0
        seen = set()
        while ray.wait(refs, num_returns=len(refs), timeout=0)[1]:
            try:
                b = rb.sample(256, prefetch=1)
            except ValueError:  # (no row written yet)
                continue
            assert len(b["a"]) == 256
            torn += helpers.storm_torn(b)
            seen |= set(b["shard"].tolist())
            batches += 1
        written = ray.get(refs)
        assert torn == 0 and batches > 0
        assert seen == {0, 1, 2}
        assert {node for node, _ in written} == set(nodes)
        # each row's writer is one of its shard's node's writers
        b = rb.sample(20_000)
        assert helpers.storm_torn(b) == 0
        writer = b["a"][:, 0] // 1_000_000_000
        assert ((writer // 10) == b["shard"]).all()
        sizes = np.array([s["size"] for s in rb.shards], float)
        want = sizes / sizes.sum() * len(b["a"])
        got = np.bincount(b["shard"], minlength=3)
        assert (np.abs(got - want) < 5 * np.sqrt(want) + 1).all(), (got, want)
        stats = rb.stats()
        assert stats["shards_up"] == 3 and stats["rows"] == sum(s["rows"] for s in stats["shards"])
        assert stats["rows_inserted"] == sum(n for _, n in written)
        assert stats["torn_read_retries"] >= 0 and {s["node"] for s in stats["shards"]} == set(nodes)
        native = native_path.path() == "native"
        assert [s["native"] for s in stats["shards"]] == [native] * 3  # (the path the shards run is this run's)
    assert shm_segments(name) == []


STORM_DRIVER = """
import sys, time, numpy as np, ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
import helpers
from shmbuf.ray import ShardedBuffer
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False,
         runtime_env={"worker_process_setup_hook": "helpers.break_stamp_check"})
helpers.break_stamp_check()

@ray.remote(num_cpus=0)
def writer(rb, w):
    seq, deadline = 0, time.monotonic() + 4
    with rb.local() as local:
        while time.monotonic() < deadline:
            local.extend(helpers.storm_rows(w, np.arange(seq, seq + 64)))
            seq += 64

nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"]][:2]
with ShardedBuffer.create(helpers.STORM, 256, name=sys.argv[2]) as rb:
    refs = [writer.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)).remote(rb, i)
            for i, n in enumerate(nodes)]
    torn = 0
    while ray.wait(refs, num_returns=2, timeout=0)[1]:
        try:
            torn += helpers.storm_torn(rb.sample(256))
        except ValueError:
            pass
    print(torn)
"""


def test_the_cluster_storm_sees_torn_rows_when_the_stamp_check_is_off(cluster, name):
    """The protection test above is not vacuous: in a job whose workers (the shard actors
    among them) copy rows without the stamp check, the same storm sees torn rows."""
    out = subprocess.run([sys.executable, "-c", STORM_DRIVER, cluster.address, name], capture_output=True,
                         text=True, timeout=90)
    assert out.returncode == 0, out.stderr[-3000:]
    assert int(out.stdout.split()[-1]) > 0
    assert shm_segments(name) == []


def test_rows_are_in_a_random_order_and_sequences_come_from_one_shard(nodes, name):
    with ShardedBuffer.create(FIELDS, 256, name=name, nodes=nodes[:2], seed=2) as rb:
        ray.get([on(node, write_rows).remote(rb, i, 100) for i, node in enumerate(nodes[:2])])
        b = rb.sample(400)
        assert 0 < (b["shard"][:200] == 0).mean() < 1  # (not shard 0's block, then shard 1's)
        empty = rb.sample(0)
        assert empty["a"].shape == (0, 7) and empty["b"].dtype == np.float64 and empty["shard"].shape == (0,)
        assert len(rb.sample(10, prefetch=3)["a"]) == 10 and len(rb._inflight) == 3
        assert len(rb.sample(20, prefetch=1)["a"]) == 20  # (asked with other arguments: dropped)
        assert len(rb._inflight) == 1 and rb._inflight[0].n == 20
        b = ray.get(on(nodes[2], sample_in_a_task).remote(rb, 64))  # (a learner in a task: the handle travels)
        assert b["a"].shape == (64, 7) and helpers.storm_torn(b) == 0
        s = rb.sample_sequences(50, 8)
        assert s["a"].shape == (50, 8, 7) and s["shard"].shape == (50,)
        key = s["a"][:, :, 0]
        assert (np.diff(key, axis=1) == 1).all() and ((key // 1_000_000_000) == s["shard"][:, None]).all()


@ray.remote
def write_versions(rb: ShardedBuffer, writer: int, versions: list) -> int:
    """Rows (writer, 10 * v + i), 10 of each version ``v``, into this node's shard."""
    with rb.local() as local:
        for v in versions:
            local.extend(helpers.storm_rows(writer, 10 * v + np.arange(10)), version=v)
        return len(local)


def test_versions_travel_through_shards_and_staleness_holds_across_the_cluster(nodes, name):
    """Shard 0 holds versions 1-3, shard 1 versions 2-5: a sample with max_staleness
    (from version=5, or from the newest row of the cluster) gets versions 4, 5 only
    (shard 1's), one with min_version=3 both shards' rows of 3 and up, in proportion to
    how many each holds; every row's version is the one its writer gave."""
    with ShardedBuffer.create(FIELDS, 256, name=name, nodes=nodes[:2], seed=4, versions=True) as rb:
        ray.get([on(nodes[0], write_versions).remote(rb, 0, [1, 2, 3]),
                 on(nodes[1], write_versions).remote(rb, 1, [2, 3, 4, 5])])
        b = rb.sample(300)
        assert (b["version"] == (b["a"][:, 0] % 1_000_000_000) // 10).all() and helpers.storm_torn(b) == 0
        assert set(b["version"].tolist()) == {1, 2, 3, 4, 5}
        recent = rb.sample(200, max_staleness=1, version=5)
        assert set(recent["version"].tolist()) == {4, 5} and set(recent["shard"].tolist()) == {1}
        assert set(rb.sample(100, max_staleness=1)["version"].tolist()) == {4, 5}  # (the cluster's newest: 5)
        later = rb.sample(4000, min_version=3)
        assert set(later["version"].tolist()) == {3, 4, 5} and 0.15 < (later["shard"] == 0).mean() < 0.35  # 10 of 40
        with pytest.raises(ValueError, match="freshness= is not supported across shards"):
            rb.sample(10, max_staleness=1, freshness=True)
        with pytest.raises(ValueError, match="max_staleness must be an int >= 0"):
            rb.sample(10, max_staleness=-1)


def test_local_on_a_node_without_a_shard_says_where_the_shards_are(nodes, name):
    here = ray.get_runtime_context().get_node_id()
    other = [n for n in nodes if n != here]
    with ShardedBuffer.create(FIELDS, 64, name=name, nodes=other[:1]) as rb:
        msg = ray.get(on(other[1], try_local).remote(rb))
        assert f"node {other[1]} has no shard of buffer {name!r}" in msg and other[0] in msg
        with pytest.raises(RuntimeError, match=f"node {here} has no shard"):
            rb.local()
        assert ray.get(on(other[0], write_rows).remote(rb, 0, 3)) == 3


def test_episode_shards_sample_n_step_and_trajectories(nodes, name):
    fields = helpers.EPISODE_STORM
    with ShardedBuffer.create(fields, 2048, name=name, nodes=nodes[:2], episodes=True, lanes=2, seed=3) as rb:
        ray.get([on(node, episode_writer).remote(rb, i) for i, node in enumerate(nodes[:2])])
        b = rb.sample(300, n_step=3, gamma=0.5)
        assert helpers.episode_storm_errors(b, "transition", n=3, gamma=0.5) == 0
        assert set(b["shard"].tolist()) == {0, 1}
        t = rb.sample_trajectories(40, 6)
        assert t["obs"].shape == (40, 6, 3) and helpers.episode_storm_errors(t, "trajectory") == 0


def test_prioritized_episode_shards_give_n_step_transitions_with_cluster_weights(nodes, name):
    fields = helpers.EPISODE_STORM
    with ShardedBuffer.create(fields, 1024, name=name, nodes=nodes[:2], episodes=True, lanes=2,
                              priority=1.0, seed=8) as rb:
        ray.get([on(node, episode_writer).remote(rb, i, 100) for i, node in enumerate(nodes[:2])])
        b = rb.sample(400, n_step=2, gamma=0.5, beta=1.0)
        assert helpers.episode_storm_errors(b, "transition", n=2, gamma=0.5) == 0
        assert b["index"].shape == (400, 3) and np.allclose(b["weight"], 1.0)
        mine = b["shard"] == 1
        assert rb.update_priorities(b["index"][mine], np.full(mine.sum(), 4.0)) > 0
        b = rb.sample(2000, n_step=2, gamma=0.5, beta=1.0)
        assert helpers.episode_storm_errors(b, "transition", n=2, gamma=0.5) == 0
        assert np.isclose(b["weight"].min(), 0.25) and b["weight"].max() == 1.0
        assert np.allclose(b["weight"][b["weight"] < 1], 0.25)


@ray.remote
def episode_writer(rb: ShardedBuffer, writer: int, steps: int = 300) -> int:
    local = rb.local()
    episode, step = np.zeros(2, np.int64), np.zeros(2, np.int64)
    with local.writer(envs=2) as w:
        for _ in range(steps // 2):
            rows = [helpers.episode_step(writer, e, episode[e], step[e]) for e in range(2)]
            plans = [helpers.episode_plan(writer, e, episode[e]) for e in range(2)]
            ended = np.array([step[e] + 1 == plans[e][0] for e in range(2)])
            term = ended & np.array([p[1] for p in plans])
            data = {k: np.stack([np.asarray(r[k]) for r in rows]) for k in helpers.EPISODE_STORM}
            data["next_obs"] = np.stack([helpers.episode_step(writer, e, episode[e], step[e] + 1)["obs"]
                                         for e in range(2)])
            w.add(data, terminated=term, truncated=ended & ~term)
            step += 1
            episode[ended] += 1
            step[ended] = 0
    local.close()
    return steps



# -- ragged rows -------------------------------------------------------------------------

@ray.remote
def ragged_writer(rb: ShardedBuffer, writer: int, seconds: float = 0.0, rows: int = 0, version: int | None = None,
                  first: int = 0) -> tuple[str, int]:
    """Rows (writer, first, first + 1, ...) of tests/helpers/ragged.py into this node's
    shard: for ``seconds`` (a storm), or ``rows`` of them: (node, rows written)."""
    from helpers.ragged import ragged_rows
    seq, deadline = first, time.monotonic() + seconds
    extra = {} if version is None else {"version": version}
    with rb.local() as local:
        while (seq - first < rows) if rows else time.monotonic() < deadline:
            chunk = min(32, rows - (seq - first)) if rows else 32
            local.extend(ragged_rows(writer, seq, seq + chunk), **extra)
            seq += chunk
    return ray.get_runtime_context().get_node_id(), seq - first


def test_ragged_rows_cross_the_cluster_whole_and_a_token_budget_never_passes_its_total(nodes, name):
    """Two writer tasks per node write ragged rows (tests/helpers/ragged.py: every value
    and length derives from the row's key) into two shards while the learner samples:
    every ragged field is one Jagged, every row whole (its values its own), rows of both
    shards; a token budget of T returns at most T tokens of "R" in all (or one row),
    and a budget too small for any row one row."""
    from helpers.ragged import RAGGED_FIELDS, ragged_keys, ragged_torn
    with ShardedBuffer.create(RAGGED_FIELDS, 2048, name=name, nodes=nodes[:2], seed=9, arena=8 << 20) as rb:
        refs = [on(node, ragged_writer).remote(rb, 10 * i + w, 2.0) for i, node in enumerate(nodes[:2])
                for w in range(2)]
        torn = batches = 0
        while ray.wait(refs, num_returns=len(refs), timeout=0)[1]:
            try:
                b = rb.sample(64, prefetch=1)
                t = rb.sample(max_tokens=2000, length="R")
            except ValueError:  # (no row written yet)
                continue
            assert isinstance(b["tokens"], shmbuf.Jagged) and len(b["tokens"]) == len(b["w"]) == 64
            assert t["tokens"].lengths.sum() <= 2000 or len(t["w"]) == 1
            torn += ragged_torn(b)
            torn += ragged_torn(t)
            batches += 1
        written = ray.get(refs)
        assert torn == 0 and batches > 0 and {n for n, _ in written} == set(nodes[:2])
        b = rb.sample(4000)
        assert ragged_torn(b) == 0 and set(b["shard"].tolist()) == {0, 1}
        assert ((b["w"] // 10) == b["shard"]).all() and (ragged_keys(b) >= 0).all()
        for T in [1, 100, 1000, 20_000]:
            for _ in range(10):
                t = rb.sample(max_tokens=T, length="R")
                total = int(t["tokens"].lengths.sum())
                assert len(t["w"]) >= 1 and (total <= T or len(t["w"]) == 1), (T, total, len(t["w"]))
                assert t["logprobs"].lengths.tolist() == t["tokens"].lengths.tolist() and ragged_torn(t) == 0
        assert set(t["shard"].tolist()) == {0, 1}  # (20,000 tokens: about 130 rows, of both shards)
        assert len(rb.sample(5, max_tokens=10**6, length="R")["w"]) == 5  # (n caps a budget)


def test_ragged_queue_shards_take_token_budgets_within_the_clusters_staleness_bound(nodes, name):
    """Two queue shards: shard 0 holds rows of versions 1 and 3, shard 1 of versions 2
    and 3 (100 each). Takes with max_staleness=0 and a budget of 3,000 tokens: every
    take within its budget, every row of version 3 (the cluster's newest) taken once,
    rows of both shards, the other 200 passed over (counted stale on their shards)."""
    from helpers.ragged import RAGGED_FIELDS, ragged_keys, ragged_torn
    with ShardedBuffer.create(RAGGED_FIELDS, 512, name=name, nodes=nodes[:2], mode="queue", versions=True,
                              arena=8 << 20, seed=10) as rb:
        ray.get([on(nodes[0], ragged_writer).remote(rb, 0, rows=100, version=1),
                 on(nodes[1], ragged_writer).remote(rb, 1, rows=100, version=2)])
        ray.get([on(nodes[0], ragged_writer).remote(rb, 0, rows=100, version=3, first=100),
                 on(nodes[1], ragged_writer).remote(rb, 1, rows=100, version=3, first=100)])
        keys: list[int] = []
        while True:
            try:
                t = rb.take(64, partial=True, max_tokens=3000, length="R", max_staleness=0, timeout=5)
            except shmbuf.SampleTimeout:
                break
            assert t["tokens"].lengths.sum() <= 3000 or len(t["w"]) == 1
            assert (t["version"] == 3).all() and ragged_torn(t) == 0 and (t["w"] == t["shard"]).all()
            keys += ragged_keys(t).tolist()
        want = [w * 1_000_000_000 + i for w in (0, 1) for i in range(100, 200)]
        assert sorted(keys) == want
        assert sum(s["rows_stale"] for s in rb.stats()["shards"]) == 200
        with pytest.raises(ValueError, match="take\\(\\) is for a queue"):
            with ShardedBuffer.create(RAGGED_FIELDS, 8, name=name + "r", nodes=nodes[:1], arena=1 << 16) as replay:
                replay.take(1)


def test_a_ragged_schema_with_options_the_shards_cannot_honor_is_refused(nodes, name, tmp_path):
    from helpers.ragged import RAGGED_FIELDS
    with pytest.raises(ValueError, match=r"shards in files \(directory=\) cannot hold them; create the "
                                         r"ShardedBuffer without directory="):
        ShardedBuffer.create(RAGGED_FIELDS, 8, name=name, arena=1 << 16, directory=str(tmp_path))
    with pytest.raises(ValueError, match="an EpisodeBuffer has no ragged fields"):
        ShardedBuffer.create(RAGGED_FIELDS, 8, name=name, nodes=nodes[:1], arena=1 << 16, episodes=True)
    with pytest.raises(ValueError, match="need arena="):
        ShardedBuffer.create(RAGGED_FIELDS, 8, name=name, nodes=nodes[:1])
    with pytest.raises(ValueError, match="leave max_times_sampled= out"):
        ShardedBuffer.create(RAGGED_FIELDS, 8, name=name, nodes=nodes[:1], arena=1 << 16, max_times_sampled=2)
    assert shm_segments(name) == [] and os.listdir(tmp_path) == []
    with ShardedBuffer.create(RAGGED_FIELDS, 8, name=name, nodes=nodes[:1], arena=1 << 16) as rb:
        ray.get(on(nodes[0], ragged_writer).remote(rb, 0, rows=4))
        with pytest.raises(ValueError, match=r"length='Q' names no ragged field or length of this buffer"):
            rb.sample(max_tokens=10, length="Q")
        with pytest.raises(ValueError, match="sample_sequences"):
            rb.sample_sequences(2, 2)

# -- priorities --------------------------------------------------------------------------

def test_priorities_are_drawn_by_mass_over_the_cluster_and_updates_go_to_their_shard(nodes, name):
    """50 rows per shard, priority 1; rows of shard 0 updated to 8 (alpha 1): shard 0
    holds 8/9 of the mass, its weights are (1/8)**beta, shard 1's are 1."""
    with ShardedBuffer.create(FIELDS, 50, name=name, nodes=nodes[:2], priority=1.0, seed=4) as rb:
        ray.get([on(node, write_rows).remote(rb, i, 50, priority=1.0) for i, node in enumerate(nodes[:2])])
        b = rb.sample(3000, beta=0.5)
        assert b["index"].shape == (3000, 3) and (b["index"][:, 0] == b["shard"]).all()
        assert np.allclose(b["weight"], 1.0)
        assert abs((b["shard"] == 0).mean() - 0.5) < 0.05
        first = b["shard"] == 0
        assert rb.update_priorities(b["index"][first], np.full(first.sum(), 8.0)) == first.sum()
        b = rb.sample(4000, beta=0.5)
        assert abs((b["shard"] == 0).mean() - 8 / 9) < 0.03
        assert np.allclose(b["weight"][b["shard"] == 0], 8.0 ** -0.5)
        assert np.allclose(b["weight"][b["shard"] == 1], 1.0)
        # stale: shard 1's rows overwritten since they were sampled are skipped; shard 0's still set
        old = b["index"][:200]
        ray.get(on(nodes[1], write_rows).remote(rb, 1, 50, priority=1.0))
        set_now = rb.update_priorities(old, np.full(len(old), 2.0))
        assert set_now == (old[:, 0] == 0).sum()
        with pytest.raises(ValueError, match=r"\(n, 3\) integer array"):
            rb.update_priorities(old[:, 1:], np.ones(len(old)))
        with pytest.raises(ValueError, match="shards must be in"):
            rb.update_priorities(old + [[5, 0, 0]], np.ones(len(old)))
        with pytest.raises(ValueError, match="finite and > 0"):
            rb.update_priorities(old, np.zeros(len(old)))


def test_priorities_near_the_bound_draw_evenly_and_a_bad_one_for_one_shard_sets_none(nodes, name):
    """Three shards of 8 rows, every row at the largest p**a a shard holds: each shard's
    mass is the largest float64, their sum is infinite; the draw is even all the same
    (before: all rows from the last shard). An update whose priority is past shard 1's
    bound is refused before any shard is asked: shard 0's row, set to 1 in the same
    call, keeps its priority (before: shard 0 set it, then shard 1 refused)."""
    top = largest_leaf(8)
    with ShardedBuffer.create(FIELDS, 8, name=name, nodes=nodes[:3], priority=1.0, seed=5) as rb:
        ray.get([on(node, write_rows).remote(rb, i, 8, priority=top) for i, node in enumerate(nodes[:3])])
        b = rb.sample(3000, beta=0.4)
        per = np.bincount(b["shard"], minlength=3)
        assert (abs(per - 1000) < 150).all(), per

        def masses() -> list[float]:
            return [s["mass"] for s in rb.stats()["shards"]]
        before = masses()
        assert min(before) > 1e308 and sum(before) == float("inf")
        rows = np.concatenate([b["index"][b["shard"] == 0][:1], b["index"][b["shard"] == 1][:1]])
        with pytest.raises(ValueError) as refused:
            rb.update_priorities(rows, [1.0, 2 * top])
        assert masses() == before
        assert refused.match(r"update_priorities \(shard 1; no priority was set\): p\*\*a must be at most")
        assert rb.update_priorities(rows, [1.0, top]) == 2
        assert masses()[0] == pytest.approx(before[0] - top + 1.0)


# -- faults ------------------------------------------------------------------------------

def test_a_killed_shard_is_dropped_and_comes_back_with_its_rows(nodes, name):
    """SIGKILL the actor of shard 1: the next batch is whole, from shards 0 and 2, with
    a warning; Ray restarts the actor on its node, it re-attaches its segment (the rows
    are still there) and rejoins."""
    with ShardedBuffer.create(FIELDS, 256, name=name, seed=5) as rb:
        ray.get([on(node, write_rows).remote(rb, i, 100 + i) for i, node in enumerate(nodes)])
        rb.sample(10)
        pid = shard_pid(rb, 1)
        os.kill(pid, signal.SIGKILL)
        with pytest.warns(ShardWarning, match=r"shard 1 .* dropped from sampling"):
            b = rb.sample(500)
        assert len(b["a"]) == 500 and set(b["shard"].tolist()) <= {0, 2}
        assert helpers.storm_torn(b) == 0
        back = wait_until_up(rb, 1)
        assert any("shard 1" in m and "is back with 101 rows" in m for m in back), back
        assert shard_pid(rb, 1) != pid
        b = rb.sample(3000)
        assert set(b["shard"].tolist()) == {0, 1, 2}
        assert sorted(set(b["a"][b["shard"] == 1, 0] % 1_000_000_000)) == list(range(101))


def test_a_stopped_shard_does_not_hang_the_learner(nodes, name):
    """SIGSTOP the actor of shard 0 (alive, silent): sample answers within its timeout
    with a whole batch from the others; after SIGCONT the shard rejoins."""
    with ShardedBuffer.create(FIELDS, 256, name=name, nodes=nodes[:2], seed=6) as rb:
        ray.get([on(node, write_rows).remote(rb, i, 100) for i, node in enumerate(nodes[:2])])
        pid = shard_pid(rb, 0)
        os.kill(pid, signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            with pytest.warns(ShardWarning, match=r"shard 0 .* did not answer within"):
                b = rb.sample(1000, timeout=2)
            assert time.monotonic() - t0 < 10
            assert len(b["a"]) == 1000 and (b["shard"] == 1).all()
            b = rb.sample(100, timeout=2)  # (down: not asked, no waiting)
            assert (b["shard"] == 1).all()
            stats = rb.stats(timeout=1)
            assert stats["shards_up"] == 1 and stats["shards"][0]["up"] is False
        finally:
            os.kill(pid, signal.SIGCONT)
        wait_until_up(rb, 0)
        assert set(rb.sample(1000)["shard"].tolist()) == {0, 1}


def test_a_shard_waiting_on_its_rate_limit_is_not_taken_for_dead(nodes, name):
    """A shard's own wait (here its rate limit: nothing may be sampled before 1000 rows)
    ends in its own error, which reaches the caller, before the learner's patience: the
    shard stays up."""
    rate = shmbuf.RateLimit(min_size=1000, samples_per_insert=1.0, error_buffer=100)
    with ShardedBuffer.create(FIELDS, 2000, name=name, nodes=nodes[:2], rate=rate) as rb:
        ray.get([on(node, write_rows).remote(rb, i, 10) for i, node in enumerate(nodes[:2])])
        with pytest.raises(shmbuf.RateLimitTimeout):
            rb.sample(4, timeout=1)
        assert all(s["up"] for s in rb.shards)


def test_a_node_that_dies_takes_its_shard_and_the_learner_goes_on(cluster, nodes, name):
    node = cluster.add_node(num_cpus=1, object_store_memory=80 * 2**20)
    cluster.wait_for_nodes()
    new = node.node_id
    try:
        with ShardedBuffer.create(FIELDS, 128, name=name, nodes=[nodes[0], new]) as rb:
            ray.get([on(n, write_rows).remote(rb, i, 50) for i, n in enumerate([nodes[0], new])])
            assert set(rb.sample(500)["shard"].tolist()) == {0, 1}
            cluster.remove_node(node)
            node = None
            with pytest.warns(ShardWarning, match="shard 1 "):
                b = rb.sample(500, timeout=4)
            assert len(b["a"]) == 500 and (b["shard"] == 0).all() and helpers.storm_torn(b) == 0
            assert rb.stats(timeout=2)["shards_up"] == 1
    finally:
        if node is not None:
            cluster.remove_node(node)
    # (the dead node's segment lived in this machine's /dev/shm: on a real cluster it goes with the node)
    for n in shm_segments(name):
        segment.unlink_name(n)


def test_when_no_shard_answers_sample_raises_and_says_so(nodes, name):
    with ShardedBuffer.create(FIELDS, 64, name=name, nodes=nodes[:1]) as rb:
        ray.get(on(nodes[0], write_rows).remote(rb, 0, 10))
        pid = shard_pid(rb, 0)
        os.kill(pid, signal.SIGSTOP)
        try:
            with pytest.warns(ShardWarning), pytest.raises(ShardsUnavailable, match=r"shards up: \[\], down: \[0\]"):
                rb.sample(10, timeout=1)
            with pytest.raises(ShardsUnavailable, match="no shard .* is up"):
                rb.sample(10, timeout=1)
        finally:
            os.kill(pid, signal.SIGCONT)


# -- lifetime ----------------------------------------------------------------------------

DRIVER = """
import sys, numpy as np, ray
from shmbuf.ray import ShardedBuffer
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
name, what = sys.argv[2], sys.argv[3]
if what == "attach":
    rb = ShardedBuffer.attach(name)
    b = rb.sample(64)
    print(len(rb), sorted(set(b["shard"].tolist())), rb.stats()["shards_up"])
else:
    rb = ShardedBuffer.create({"x": ((), "int64")}, 32, name=name, persist=what == "persist")
    print(len(rb.shards), flush=True)
    if what == "kill":
        import os, signal
        os.kill(os.getpid(), signal.SIGKILL)
"""


def driver(cluster, name: str, what: str) -> str:
    out = subprocess.run([sys.executable, "-c", DRIVER, cluster.address, name, what], capture_output=True,
                         text=True, timeout=90)
    assert out.returncode == (-signal.SIGKILL if what == "kill" else 0), out.stderr[-3000:]
    return out.stdout.strip()


def gone(name: str, seconds: float = 30) -> bool:
    """Whether the buffer's segments and shard actors are gone within ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        actors = [a for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith(name + ".")]
        if not shm_segments(name) and not actors:
            return True
        time.sleep(0.2)
    return False


def test_another_job_attaches_by_name(cluster, nodes, name):
    with ShardedBuffer.create(FIELDS, 128, name=name, seed=7) as rb:
        ray.get([on(node, write_rows).remote(rb, i, 10) for i, node in enumerate(nodes)])
        assert driver(cluster, name, "attach") == "30 [0, 1, 2] 3"
    with pytest.raises(FileNotFoundError, match="no ShardedBuffer named"):
        ShardedBuffer.attach(name)


def test_a_driver_that_exits_takes_its_buffer_along_unless_persist(cluster, nodes, name):
    assert driver(cluster, name, "create") == "3"
    assert gone(name)
    assert driver(cluster, name + "k", "kill") == "3"  # SIGKILLed: no atexit, no finalizer
    assert gone(name + "k")
    assert driver(cluster, name + "p", "persist") == "3"
    assert len(shm_segments(name + "p")) == 3
    rb = ShardedBuffer.attach(name + "p")
    assert len(rb) == 0 and len(rb.shards) == 3
    rb.unlink()
    assert shm_segments(name + "p") == []
    with pytest.raises(FileNotFoundError):
        ShardedBuffer.attach(name + "p")


def test_exist_ok_takes_over_segments_left_behind(nodes, name):
    left = shmbuf.Buffer.create(FIELDS, 64, name=f"{name}.0", persist=True)
    left.extend(helpers.storm_rows(0, np.arange(5)))
    left.close()
    with pytest.raises(FileExistsError, match="exist_ok=True"):
        ShardedBuffer.create(FIELDS, 64, name=name, nodes=nodes[:1])
    with pytest.raises(ValueError, match="holds 64 rows"):
        ShardedBuffer.create(FIELDS, 32, name=name, nodes=nodes[:1], exist_ok=True)
    with pytest.raises(ValueError, match="has no priorities, not priority exponent 0.6 as asked"):
        ShardedBuffer.create(FIELDS, 64, name=name, nodes=nodes[:1], exist_ok=True, priority=0.6)
    with ShardedBuffer.create(FIELDS, 64, name=name, nodes=nodes[:1], exist_ok=True) as rb:
        assert len(rb) == 5
    assert shm_segments(name) == []


def test_bad_arguments_get_clear_errors_and_change_nothing(nodes, name):
    with pytest.raises(ValueError, match="distinct IDs of alive nodes"):
        ShardedBuffer.create(FIELDS, 64, name=name, nodes=["f" * 56])
    with pytest.raises(ValueError, match="capacity_per_node"):
        ShardedBuffer.create(FIELDS, 0, name=name)
    with pytest.raises(ValueError, match="invalid buffer name"):
        ShardedBuffer.create(FIELDS, 8, name="/bad")
    with pytest.raises(ValueError, match="fields must be"):
        ShardedBuffer.create({}, 8, name=name)
    assert shm_segments(name) == []
    with ShardedBuffer.create(FIELDS, 64, name=name, nodes=nodes[:2]) as rb:
        with pytest.raises(FileExistsError, match="is live on this Ray cluster"):
            ShardedBuffer.create(FIELDS, 64, name=name, nodes=nodes[:2])
        with pytest.raises(ValueError, match="empty buffer"):
            rb.sample(4)
        ray.get(on(nodes[0], write_rows).remote(rb, 0, 4))
        with pytest.raises(ValueError, match="beta= is for a prioritized buffer"):
            rb.sample(4, beta=0.4)
        with pytest.raises(ValueError, match="update_priorities is for a prioritized"):
            rb.update_priorities(np.zeros((1, 3), int), [1.0])
        with pytest.raises(TypeError):  # a shard's own error reaches the caller as it is
            rb.sample(4, n_step=3)
        with pytest.raises(ValueError, match="episodes=True"):
            rb.sample_trajectories(4, 2)
        assert len(rb.sample(4)["a"]) == 4


def test_the_apex_example_runs_on_the_cluster(cluster):
    script = os.path.join(os.path.dirname(TESTS), "examples", "ray_apex.py")
    out = subprocess.run([sys.executable, script, "--address", cluster.address, "--seconds", "3"],
                         capture_output=True, text=True, timeout=110)
    assert out.returncode == 0, out.stderr[-3000:]
    last = out.stdout.strip().splitlines()[-1]
    assert "steps written on 3 nodes" in last and "rows in 3 shards" in last, out.stdout
    assert shm_segments("apex-example") == []


def test_shards_in_files_on_each_node_are_written_sampled_flushed_and_removed(nodes, name, tmp_path):
    with ShardedBuffer.create(FIELDS, 128, name=name, seed=3, directory=str(tmp_path)) as rb:
        assert sorted(os.listdir(tmp_path)) == sorted(f"{name}.{i}.shmbuf" for i in range(len(nodes)))
        assert shm_segments(name) == []  # nothing in /dev/shm
        ray.get([on(node, write_rows).remote(rb, i, 10) for i, node in enumerate(nodes)])
        rb.flush()
        assert len(rb) == 10 * len(nodes) and helpers.storm_torn(rb.sample(64)) == 0
        again = ShardedBuffer.attach(name)
        assert [s.segment for s in again._shards] == [str(tmp_path / f"{name}.{i}.shmbuf") for i in range(len(nodes))]
        assert len(again) == 10 * len(nodes)
        with pytest.raises(ValueError, match="absolute path"):
            ShardedBuffer.create(FIELDS, 128, name=name + "r", directory="relative/dir")
    assert os.listdir(tmp_path) == []  # not persistent: the shards removed their files
