"""shmbuf.ray.ShardedBuffer on a Ray cluster of this machine (``ray.cluster_utils``: a
head and one more node), against one local shmbuf, a plain Ray actor holding a numpy
ring (the pattern users write by hand) and TorchRL's ``RayReplayBuffer``, in one run.

Workload "mujoco" (165 bytes a row); medians of 3 interleaved rounds:
- ingest: one writer, 64 rows per call: a local Buffer in this process (no Ray), a Ray
  task writing through ``ShardedBuffer.local()``, a Ray task sending the rows to the numpy
  ring actor (4 calls in flight), TorchRL's ``extend`` from this process;
- learner: batches of 256 per second from full buffers: the local Buffer, the
  ShardedBuffer (2 shards, one per node) without and with ``prefetch``, two numpy ring
  actors asked for 128 rows each, TorchRL's ``sample``.

scripts/bench-ray runs it in .venv-ray (made by scripts/test-ray) with torchrl added.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any, Callable

import numpy as np

FIELDS = {"obs": ((17,), "float32"), "next_obs": ((17,), "float32"), "action": ((6,), "float32"),
          "reward": ((), "float32"), "done": ((), "bool")}


def rows(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {k: rng.random((n,) + shape).astype(dtype) for k, (shape, dtype) in FIELDS.items() if dtype != "bool"}
    out["done"] = rng.random(n) < 0.01
    return out


def rate(f: Callable[[], Any], seconds: float, per: int = 1) -> float:
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        f()
        n += per
    return n / (time.perf_counter() - t0)


class NumpyRing:
    """The buffer users write by hand: a Ray actor holding numpy arrays."""

    def __init__(self, capacity: int) -> None:
        self.arrays = {k: np.zeros((capacity,) + s, d) for k, (s, d) in FIELDS.items()}
        self.capacity, self.pos, self.size = capacity, 0, 0
        self.rng = np.random.default_rng(0)

    def add(self, batch: dict[str, np.ndarray]) -> int:
        n = len(batch["obs"])
        idx = (self.pos + np.arange(n)) % self.capacity
        for k, a in self.arrays.items():
            a[idx] = batch[k]
        self.pos = (self.pos + n) % self.capacity
        self.size = min(self.size + n, self.capacity)
        return self.size

    def sample(self, n: int) -> dict[str, np.ndarray]:
        idx = self.rng.integers(self.size, size=n)
        return {k: a[idx] for k, a in self.arrays.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="0.5 s windows and 100k rows per node")
    parser.add_argument("--no-torchrl", action="store_true", help="leave TorchRL out")
    args = parser.parse_args()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray
    from ray.cluster_utils import Cluster
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    import shmbuf
    from shmbuf.ray import ShardedBuffer

    seconds = 0.5 if args.quick else 2.0
    cap = 100_000 if args.quick else 1_000_000
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "object_store_memory": 300 * 2**20})
    cluster.add_node(num_cpus=2, object_store_memory=300 * 2**20)
    ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False)
    cluster.wait_for_nodes()
    here = ray.get_runtime_context().get_node_id()
    other = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeID"] != here)

    def on(node: str) -> dict[str, Any]:
        return {"num_cpus": 0, "scheduling_strategy": NodeAffinitySchedulingStrategy(node, soft=False)}

    @ray.remote
    def write_local(rb: Any, seconds: float, fill: int = 0) -> float:
        chunk = rows(64)
        with rb.local() as local:
            if fill:
                local.extend(rows(fill, 1))
                return 0.0
            return rate(lambda: local.extend(chunk), seconds, 64)

    @ray.remote
    def write_ring(ring: Any, seconds: float) -> float:
        chunk, inflight = rows(64), []

        def add() -> None:
            inflight.append(ring.add.remote(chunk))
            if len(inflight) >= 4:
                ray.get(inflight.pop(0))
        r = rate(add, seconds, 64)
        ray.get(inflight)
        return r

    Ring = ray.remote(num_cpus=0)(NumpyRing)
    local = shmbuf.Buffer.create(FIELDS, cap, seed=0)
    rb = ShardedBuffer.create(FIELDS, cap, name=f"bench-ray-{os.getpid()}", seed=0)
    rings = [Ring.options(**on(n["NodeID"])).remote(cap) for n in ray.nodes() if n["Alive"]]
    trl = None
    if not args.no_torchrl:
        import torch
        from functools import partial
        from tensordict import TensorDict
        from torchrl.data import LazyTensorStorage, RayReplayBuffer

        trl = RayReplayBuffer(storage=partial(LazyTensorStorage, cap), batch_size=256,
                              remote_config={"num_cpus": 0})

        def td(batch: dict[str, np.ndarray]) -> Any:
            return TensorDict({k: torch.from_numpy(v) for k, v in batch.items()}, batch_size=[len(batch["obs"])])
        trl_chunk = td(rows(64))
    got: dict[tuple[str, str], list[float]] = {}

    def keep(what: str, who: str, value: float) -> None:
        got.setdefault((what, who), []).append(value)

    chunk = rows(64)
    try:
        for _ in range(3):  # ingest (the rings get the same rows as the shards)
            keep("ingest", "local", rate(lambda: local.extend(chunk), seconds, 64))
            keep("ingest", "sharded", ray.get(write_local.options(**on(other)).remote(rb, seconds)))
            keep("ingest", "ring", ray.get(write_ring.options(**on(other)).remote(rings[1], seconds)))
            if trl is not None:
                keep("ingest", "torchrl", rate(lambda: trl.extend(trl_chunk), seconds, 64))
        big = rows(min(cap, 200_000), 1)
        for _ in range(-(-cap // len(big["obs"]))):  # fill everything
            local.extend(big)
            ray.get([r.add.remote(big) for r in rings])
            if trl is not None:
                trl.extend(td(big))
        ray.get([write_local.options(**on(n["NodeID"])).remote(rb, 0, cap) for n in ray.nodes() if n["Alive"]])
        for _ in range(3):
            keep("sample", "local", rate(lambda: local.sample(256), seconds))
            keep("sample", "sharded", rate(lambda: rb.sample(256), seconds))
            keep("sample", "sharded_prefetch", rate(lambda: rb.sample(256, prefetch=4), seconds))
            keep("sample", "ring", rate(lambda: ray.get([r.sample.remote(128) for r in rings]), seconds))
            if trl is not None:
                keep("sample", "torchrl", rate(trl.sample, seconds))
        assert len(rb) == 2 * cap
    finally:
        rb.close()
        local.close()
        if trl is not None:
            # TorchRL's actor holds multiprocessing Values, named semaphores in /dev/shm that
            # its close() (ray.kill) leaves behind: let the actor exit by itself first.
            ray.wait([trl._rb.__ray_terminate__.remote()], timeout=30)
            trl.close()
        ray.shutdown()
        cluster.shutdown()
    med = {k: float(np.median(v)) for k, v in got.items()}
    import platform
    print(f"Ray {ray.__version__}, 2 nodes of ray.cluster_utils.Cluster on one machine ({os.cpu_count()} cores), "
          f"Python {platform.python_version()}; mujoco rows (165 B), {cap:,} rows per buffer/shard; "
          f"medians of 3 rounds of {seconds:g} s\n")
    table(med, "ingest", "ingest: one writer, 64 rows a call", "rows/s", "ShardedBuffer.local() / it", "sharded", (
        ("local", "shmbuf.Buffer in the writer's process (no Ray)"),
        ("sharded", "ShardedBuffer.local() in a Ray task"),
        ("ring", "plain Ray actor with a numpy ring (4 calls in flight)"),
        ("torchrl", "TorchRL RayReplayBuffer.extend")))
    print()
    table(med, "sample", "learner: batches of 256", "batches/s", "ShardedBuffer (prefetch) / it", "sharded_prefetch", (
        ("local", "shmbuf.Buffer.sample, same process (one node)"),
        ("sharded", "ShardedBuffer.sample, 2 shards"),
        ("sharded_prefetch", "ShardedBuffer.sample, 2 shards, prefetch=4"),
        ("ring", "2 plain Ray numpy-ring actors, 128 rows each"),
        ("torchrl", "TorchRL RayReplayBuffer.sample")))


def table(med: dict, what: str, title: str, unit: str, against: str, ours: str, rows: tuple) -> None:
    """A markdown table of the medians of ``what``: each against the local shmbuf, and
    ``ours`` against each."""
    print(f"| {title} | {unit} | / local shmbuf | {against} |\n|---|---:|---:|---:|")
    for who, label in rows:
        if (what, who) in med:
            v = med[(what, who)]
            print(f"| {label} | {v:,.0f} | {v / med[(what, 'local')]:.3f}x | {med[(what, ours)] / v:,.2f}x |")

if __name__ == "__main__":
    main()
