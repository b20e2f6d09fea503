"""``shmbuf demo``: rollout workers write episodes into one buffer while a learner samples it.

Each worker process attaches to the buffer by name, steps its own vectorised CartPole
with a random policy and adds one step per env per call through an episode writer
(env ``i`` into a lane of its own; the real final observation where an episode ends).
The learner (this process) samples transitions the whole time and checks every one:
each row carries a checksum of its other fields, so a torn row (fields from two
writes) shows, and the next observation must be what the physics gives for the
observation and action (so a transition joined across two episodes shows). Now and
then it samples whole episodes and reports their returns.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import time
from typing import Any

import numpy as np

from shmbuf.demo.envs import CartPole
from shmbuf.episodes import EpisodeBuffer

FIELDS = {"obs": ((4,), np.float32), "action": ((), np.int64), "reward": ((), np.float32),
          "check": ((), np.float64)}


def checksum(b: dict[str, np.ndarray]) -> np.ndarray:
    """A number that changes if any field of a row comes from another row."""
    return b["obs"].astype(np.float64) @ np.array([1.0, 3.0, 5.0, 7.0]) + 11 * b["action"] \
        + 13 * b["reward"].astype(np.float64)


def wrong_next(b: dict[str, np.ndarray]) -> np.ndarray:
    """Transitions whose next observation is not the one the physics gives."""
    want = CartPole.dynamics(b["obs"], b["action"])
    return ~np.isclose(b["next_obs"], want, rtol=1e-4, atol=1e-5).all(axis=1)


def worker(name: str, envs: int, seed: int, stop: Any) -> None:
    """Step ``envs`` CartPoles with a random policy and write every step.

    Stops when told to, or when the buffer is gone (its creator closed it or died):
    a worker whose learner crashed does not write on forever."""
    buf = EpisodeBuffer.attach(name)
    env = CartPole(envs, seed=seed)
    rng = np.random.default_rng(seed)
    steps = 0
    with buf.writer(envs=envs) as w:
        while not stop.is_set() and (steps % 64 or not buf.core.unlinked):
            steps += 1
            obs, action = env.obs, rng.integers(0, 2, envs)
            next_obs, reward, terminated, truncated = env.step(action)
            step = {"obs": obs, "action": action, "reward": reward, "next_obs": next_obs}
            step["check"] = checksum(step)
            w.add(step, terminated=terminated, truncated=truncated)
    buf.close()


START_TIMEOUT = 120.0  # seconds the workers may take to write their first batch


def run(workers: int = 2, envs: int = 16, seconds: float = 10.0, capacity: int = 100_000,
        batch: int = 256, quiet: bool = False) -> dict[str, Any]:
    """Run the demo and return its figures (rows/s, batches/s, torn rows, returns)."""
    lanes = workers * envs
    capacity -= capacity % lanes
    ctx = mp.get_context("spawn")  # workers inherit nothing: they attach by name
    name = f"demo-{os.getpid()}"
    with EpisodeBuffer.create(FIELDS, capacity, name=name, lanes=lanes, seed=0) as buf:
        stop = ctx.Event()
        procs = [ctx.Process(target=worker, args=(name, envs, i, stop), daemon=True) for i in range(workers)]
        for p in procs:
            p.start()
        batches = torn = wrong = 0
        returns: list[float] = []
        t0 = last = time.monotonic()
        try:
            # the clock starts once the workers' first batch of transitions is there (their
            # start-up, a few seconds on a busy machine, is not part of the run)
            while buf.transition_count < batch:
                if time.monotonic() - t0 > START_TIMEOUT:
                    raise RuntimeError(f"the rollout workers wrote {buf.transition_count} transitions in "
                                       f"{START_TIMEOUT:g} s, fewer than one batch of {batch}: the demo stops "
                                       "(anything they printed is above)")
                time.sleep(0.001)
            t0 = last = time.monotonic()
            while (now := time.monotonic()) - t0 < seconds or batches == 0:  # (one batch at least)
                b = buf.sample(batch)
                torn += int((checksum(b) != b["check"]).sum())
                wrong += int(wrong_next(b).sum())
                batches += 1
                if batches % 20 == 0:
                    try:
                        returns += [float(e["reward"].sum()) for e in buf.sample_episodes(4)]
                    except ValueError:
                        pass  # no episode has ended yet
                if not quiet and now - last >= 0.5:
                    last = now
                    _progress(now - t0, seconds, buf, batches, torn + wrong, returns)
        finally:
            elapsed = time.monotonic() - t0
            stop.set()
            for p in procs:
                p.join(30)
        written = buf.core.total_added
        episodes = buf.num_episodes
    if not quiet:
        sys.stderr.write("\n")
    return {"workers": workers, "envs per worker": envs, "seconds": elapsed,
            "rows written": written, "rows written/s": written / elapsed,
            "batches sampled": batches, "batches/s": batches / elapsed,
            "rows checked": batches * batch, "torn rows": torn, "wrong next": wrong,
            "episodes": episodes, "returns": returns}


def _progress(t: float, seconds: float, buf: EpisodeBuffer, batches: int, bad: int, returns: list[float]) -> None:
    written = buf.core.total_added
    mean = f"{np.mean(returns):6.1f}" if returns else "     -"
    sys.stderr.write(
        f"\r  {t:4.1f}/{seconds:g} s  written {written:>11,} ({written / t:>10,.0f}/s)  "
        f"episodes {buf.num_episodes:>7,}  return {mean}  batches {batches:>8,} ({batches / t:>7,.0f}/s)"
        f"  bad {bad}")
    sys.stderr.flush()


def table(r: dict[str, Any]) -> str:
    """The demo's figures as a markdown table."""
    rets = r["returns"]
    ret = f"{np.mean(rets):.1f} ({min(rets):.0f}-{max(rets):.0f})" if rets else "-"
    rows = [("rollout workers x envs", f"{r['workers']} x {r['envs per worker']}"),
            ("duration", f"{r['seconds']:.1f} s"),
            ("steps written", f"{r['rows written']:,}"),
            ("steps written per second", f"{r['rows written/s']:,.0f}"),
            ("episodes in the buffer", f"{r['episodes']:,}"),
            ("whole episodes sampled", f"{len(rets):,}"),
            ("return per episode: mean (min-max)", ret),
            ("batches of transitions sampled", f"{r['batches sampled']:,}"),
            ("batches sampled per second", f"{r['batches/s']:,.0f}"),
            ("sampled transitions checked", f"{r['rows checked']:,}"),
            ("torn rows detected", f"{r['torn rows']}"),
            ("wrong next observations", f"{r['wrong next']}")]
    w = max(len(a) for a, _ in rows)
    v = max(len(b) for _, b in rows)
    lines = [f"| {'metric'.ljust(w)} | {'value'.rjust(v)} |", f"|{'-' * (w + 2)}|{'-' * (v + 1)}:|"]
    lines += [f"| {a.ljust(w)} | {b.rjust(v)} |" for a, b in rows]
    return "\n".join(lines)
