"""Ape-X-shaped replay across nodes with shmbuf.ray: rollout tasks on every node write
CartPole steps into their node's shard; a learner samples prioritized n-step batches
from all shards, fits a linear Q-function and sends the new priorities back.

    pip install '.[ray]'        # from a clone
    python examples/ray_apex.py                     # a 2-node Ray cluster simulated here
    python examples/ray_apex.py --address auto      # a real cluster (ray start ...)

The rollout tasks act epsilon-greedily with the learner's latest weights (a small
array they fetch from an actor now and then); the rows themselves never go through Ray on
their way in, only the sampled batches on their way out.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

FIELDS = {"obs": ((4,), np.float32), "action": ((), np.int64), "reward": ((), np.float32)}


def features(obs: np.ndarray) -> np.ndarray:
    """A small fixed basis: the state, its squares, a bias."""
    return np.concatenate([obs, obs ** 2, np.ones(obs.shape[:-1] + (1,))], axis=-1)


class Board:
    """The learner's latest weights, for the rollouts to fetch (a Ray actor)."""

    def __init__(self, W: np.ndarray) -> None:
        self.W = W

    def set(self, W: np.ndarray) -> None:
        self.W = W

    def get(self) -> np.ndarray:
        return self.W


def rollout(rb, board, seconds: float, seed: int) -> int:
    """Step 8 CartPoles for ``seconds`` into this node's shard; returns steps written."""
    import ray
    from shmbuf.demo.envs import CartPole

    rng, env, steps = np.random.default_rng(seed), CartPole(8, seed=seed), 0
    deadline = time.monotonic() + seconds
    W = ray.get(board.get.remote())
    with rb.local(seed=seed) as local, local.writer(envs=8) as w:
        while time.monotonic() < deadline:
            if steps % 800 == 0:
                W = ray.get(board.get.remote())
            obs = env.obs
            greedy = (features(obs) @ W.T).argmax(axis=1)
            action = np.where(rng.random(8) < 0.2, rng.integers(2, size=8), greedy)
            nxt, reward, term, trunc = env.step(action)
            w.add({"obs": obs, "action": action, "reward": reward, "next_obs": nxt},
                  terminated=term, truncated=trunc)
            steps += 8
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--address", help="a running Ray cluster ('auto'); default: simulate 2 nodes here")
    parser.add_argument("--seconds", type=float, default=20.0, help="how long the rollouts run")
    args = parser.parse_args()
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from shmbuf.ray import ShardedBuffer

    cluster = None
    if args.address is None:
        from ray.cluster_utils import Cluster
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
        cluster.add_node(num_cpus=1)
        args.address = cluster.address
    ray.init(address=args.address, logging_level="ERROR", log_to_driver=False)
    if cluster is not None:
        cluster.wait_for_nodes()
    nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
    gamma, n_step, lr = 0.99, 3, 0.01
    W = np.zeros((2, 9))
    board = ray.remote(num_cpus=0)(Board).remote(W)
    with ShardedBuffer.create(FIELDS, 100_000, name="apex-example", episodes=True, lanes=8,
                              priority=0.6, seed=0) as rb:
        task = ray.remote(num_cpus=0)(rollout)
        refs = [task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False))
                .remote(rb, board, args.seconds, i) for i, node in enumerate(nodes)]
        updates, t0 = 0, time.monotonic()
        while ray.wait(refs, num_returns=len(refs), timeout=0)[1]:
            try:
                b = rb.sample(256, n_step=n_step, gamma=gamma, beta=0.4, prefetch=2)
            except ValueError:  # (nothing written yet)
                time.sleep(0.1)
                continue
            phi, phi_next = features(b["obs"]), features(b["next_obs"])
            bootstrap = np.where(b["terminated"], 0.0, gamma ** b["steps"] * (phi_next @ W.T).max(axis=1))
            q = (phi * W[b["action"]]).sum(axis=1)
            td = b["reward"] + bootstrap - q
            for a in (0, 1):  # an importance-weighted SGD step
                m = b["action"] == a
                if m.any():
                    W[a] += lr * ((b["weight"][m] * td[m])[:, None] * phi[m]).mean(axis=0)
            rb.update_priorities(b["index"], np.abs(td) + 1e-3)
            updates += 1
            if updates % 100 == 0:
                board.set.remote(W.copy())
                print(f"{time.monotonic() - t0:5.1f} s  {updates} updates  mean |td| {np.abs(td).mean():.3f}  "
                      f"rows per shard {[s['size'] for s in rb.shards]}")
        steps = sum(ray.get(refs))
        stats = rb.stats()
        print(f"{steps} steps written on {len(nodes)} nodes, {updates} batches learned from; "
              f"{stats['rows']} rows in {stats['shards_up']} shards; {stats['rows_sampled']} rows sampled")
    ray.shutdown()
    if cluster is not None:
        cluster.shutdown()


if __name__ == "__main__":
    main()
