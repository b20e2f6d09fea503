"""``scripts/bench``'s episode part: EpisodeBuffer beside the core Buffer on the same
workloads (interleaved windows in one process, so the ratios hold on a noisy machine),
and the shared memory each takes per transition, with cpprb's ``next_of`` /
``stack_compress`` (local buffers) where they apply.

* mujoco: the core buffer holds obs and next_obs of every row; the episode buffer
  (8 lanes, episodes of 1000 steps) holds obs once. Sampling one-step and 3-step
  transitions; writing the steps of 8 envs per call against an 8-row ``extend``.
* atari: the core buffer holds stacks of 4 frames as obs and next_obs; the episode
  buffer single frames with ``frame_stack=4``.

Samples are the default calls (a new batch each call, as users write them); the core
buffer's ``sample(256, out=)`` is measured beside them as ``Buffer out=`` (the episode
buffer's samples have no ``out=``). The ratios compare the default calls.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import statistics
from typing import Any, Callable

import numpy as np

import shmbuf

from benchmarks.peers import BATCH, WORKLOADS

EPISODE = 1000  # steps per episode
ENVS = 8


def run(r: Any, cfg: Any, loop: Callable[[Callable[[], Any], float], float], progress: Any) -> None:
    """Fill ``r.extra["episodes"]``: {workload: {metric: {system: [values]}}} and
    ``r.extra["episode memory"]``."""
    figures: dict[str, dict[str, dict[str, list[float]]]] = {}
    r.extra["episodes"] = figures

    def add(wl: str, metric: str, system: str, value: float) -> None:
        figures.setdefault(wl, {}).setdefault(metric, {}).setdefault(system, []).append(value)

    tag = f"bench-ep-{os.getpid()}"
    for wl_name in ("mujoco", "atari"):
        if wl_name not in cfg.workloads:
            continue
        wl = WORKLOADS[wl_name]
        cap = (wl.capacity if not cfg.quick else wl.capacity // 5) // ENVS * ENVS
        progress(f"episodes, {wl_name}: filling")
        core, eps = _filled(wl_name, cap, tag)
        try:
            cout = core.empty_batch(BATCH)  # (EpisodeBuffer's samples have no out=)
            pairs: list[tuple[str, str, Callable[[], Any]]] = [
                ("sample 256", "Buffer", lambda: core.sample(BATCH)),
                ("sample 256", "Buffer out=", lambda: core.sample(BATCH, out=cout)),
                ("sample 256", "EpisodeBuffer", lambda: eps.sample(BATCH))]
            if wl_name == "mujoco":
                pairs.append(("sample 256, n_step=3", "EpisodeBuffer", lambda: eps.sample(BATCH, n_step=3)))
            for rep in range(cfg.repeats):
                progress(f"episodes, {wl_name}: sampling, repeat {rep + 1}/{cfg.repeats}")
                for metric, system, fn in pairs:
                    add(wl_name, metric, system, loop(fn, cfg.window))
            if wl_name == "mujoco":
                _writes(cfg, tag, loop, add, progress)
        finally:
            core.close()
            eps.close()
    r.extra["episode memory"] = memory(cfg)


def _filled(wl_name: str, cap: int, tag: str) -> tuple[shmbuf.Buffer, shmbuf.EpisodeBuffer]:
    """The core buffer of the workload and the episode buffer that stands for it, full."""
    wl = WORKLOADS[wl_name]
    fields, stack = _episode_fields(wl_name)
    core = shmbuf.Buffer.create(wl.fields, cap, name=f"{tag}-{wl_name}-core", seed=0)
    try:
        eps = shmbuf.EpisodeBuffer.create(fields, cap, lanes=ENVS, frame_stack=stack,
                                          name=f"{tag}-{wl_name}-eps", seed=0)
    except BaseException:
        core.close()
        raise
    try:
        chunk = min(4096 if wl.row_bytes < 4096 else 64, cap)
        data = wl.data(chunk, 1)
        for _ in range(cap // chunk + 1):
            core.extend(data)
        steps = min(EPISODE, eps.lane_capacity - 1)
        one = _steps(wl_name, steps)
        one["next_obs"] = one["obs"][-1]
        with eps.writer(envs=ENVS) as w:
            for _ in range(cap // ENVS // (steps + 1) + 1):
                for env in range(ENVS):
                    w.add_episode(one, terminated=bool(env % 2), env=env)
        core.prefault()
        eps.core.prefault()
    except BaseException:
        core.close()
        eps.close()
        raise
    return core, eps


def _episode_fields(wl_name: str) -> tuple[dict[str, Any], int]:
    fields = {k: v for k, v in WORKLOADS[wl_name].fields.items() if k not in ("next_obs", "done")}
    if wl_name == "atari":
        return {**fields, "obs": ((84, 84), np.uint8)}, 4
    return fields, 1


def _steps(wl_name: str, n: int) -> dict[str, np.ndarray]:
    fields, _ = _episode_fields(wl_name)
    wl = WORKLOADS[wl_name]
    data = wl.data(n, 2)
    out = {k: data[k] for k in fields if k != "obs"}
    out["obs"] = data["obs"][:, -1] if wl_name == "atari" else data["obs"]
    return out


def _writes(cfg: Any, tag: str, loop: Any, add: Any, progress: Any) -> None:
    """Rows/s: 8 rows per extend (the core) against the steps of 8 envs per add."""
    wl = WORKLOADS["mujoco"]
    core = shmbuf.Buffer.create(wl.fields, 100_000, name=f"{tag}-w-core")
    fields, _ = _episode_fields("mujoco")
    eps = shmbuf.EpisodeBuffer.create(fields, 100_000, lanes=ENVS, name=f"{tag}-w-eps")
    writer = eps.writer(envs=ENVS)
    try:
        rows = wl.data(64 * ENVS, 3)
        batches = [{k: v[i:i + ENVS] for k, v in rows.items()} for i in range(0, 64 * ENVS, ENVS)]
        steps = [{k: b[k] for k in ("obs", "action", "reward", "next_obs")} for b in batches]
        # flags: each env ends an episode every EPISODE steps, the envs staggered
        cycle = EPISODE * 2
        term = [np.array([(t + 250 * e) % EPISODE == EPISODE - 1 and e % 2 == 0 for e in range(ENVS)])
                for t in range(cycle)]
        trunc = [np.array([(t + 250 * e) % EPISODE == EPISODE - 1 and e % 2 == 1 for e in range(ENVS)])
                 for t in range(cycle)]
        state = {"core": 0, "eps": 0}

        def extend() -> None:
            i = state["core"] = (state["core"] + 1) % len(batches)
            core.extend(batches[i])

        def step() -> None:
            i = state["eps"] = state["eps"] + 1
            writer.add(steps[i % len(steps)], terminated=term[i % cycle], truncated=trunc[i % cycle])
        for _ in range(EPISODE):  # every env in an episode: the steady state
            step()
        for rep in range(cfg.repeats):
            progress(f"episodes, mujoco: writing, repeat {rep + 1}/{cfg.repeats}")
            add("mujoco", f"write {ENVS} envs per call (rows/s)", "Buffer", loop(extend, cfg.window) * ENVS)
            add("mujoco", f"write {ENVS} envs per call (rows/s)", "EpisodeBuffer", loop(step, cfg.window) * ENVS)
    finally:
        writer.close()
        eps.close()
        core.close()


# -- memory ------------------------------------------------------------------------------

def memory(cfg: Any) -> dict[str, dict[str, float | None]]:
    """Bytes of memory per transition of capacity: shmbuf's from the layout, cpprb's
    (local ReplayBuffer with next_of, and stack_compress for atari) from the memory a
    process gains filling one."""
    out: dict[str, dict[str, float | None]] = {}
    for wl_name in ("mujoco", "atari"):
        if wl_name not in cfg.workloads:
            continue
        wl = WORKLOADS[wl_name]
        cap = 100_000 if wl_name == "mujoco" else 20_000
        row: dict[str, float | None] = {}
        core = shmbuf.Buffer.create(wl.fields, cap)
        row["Buffer (obs + next_obs)"] = core.nbytes / cap
        core.close()
        fields, stack = _episode_fields(wl_name)
        if stack > 1:
            once = shmbuf.EpisodeBuffer.create({**fields, "obs": WORKLOADS[wl_name].fields["obs"]}, cap)
            row["EpisodeBuffer (obs once)"] = once.nbytes / cap
            once.close()
        eps = shmbuf.EpisodeBuffer.create(fields, cap, frame_stack=stack)
        row["EpisodeBuffer" + (f" (frame_stack={stack})" if stack > 1 else " (obs once)")] = eps.nbytes / cap
        eps.close()
        row["cpprb next_of" + (" + stack_compress" if stack > 1 else "")] = _cpprb_bytes(wl_name, cap)
        out[wl_name] = row
    return out


def _cpprb_bytes(wl_name: str, cap: int) -> float | None:
    try:
        import cpprb  # noqa: F401
    except ImportError:
        return None
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_cpprb_child, args=(wl_name, cap, q))
    p.start()
    try:
        got = q.get(timeout=120)
    finally:
        p.join(60)
    return got


def _cpprb_child(wl_name: str, cap: int, q: Any) -> None:
    import cpprb
    import psutil

    try:
        wl = WORKLOADS[wl_name]
        proc = psutil.Process()
        env_dict = {k: {"shape": s or 1, "dtype": d} for k, (s, d) in wl.fields.items() if k != "next_obs"}
        data = wl.data(256, 4)
        rows = {k: data[k] for k in env_dict}
        rows["next_obs"] = data["next_obs"]
        if wl_name == "atari":  # cpprb stacks frames on the last axis: stacks of consecutive frames
            frames = data["obs"][:, 0]
            stacks = np.stack([np.roll(frames, -i, axis=0) for i in range(5)], axis=-1)
            rows["obs"], rows["next_obs"] = stacks[..., :4].copy(), stacks[..., 1:].copy()
            env_dict["obs"]["shape"] = (84, 84, 4)
        before = proc.memory_full_info().uss
        kw: dict[str, Any] = {"next_of": "obs"}
        if wl_name == "atari":
            kw["stack_compress"] = "obs"
        rb = cpprb.ReplayBuffer(cap, env_dict, **kw)
        for _ in range(cap // 256 + 1):
            rb.add(**rows)
            rb.on_episode_end()
        q.put((proc.memory_full_info().uss - before) / cap)
    except Exception:  # noqa: BLE001 (a figure left out, not a failed run)
        q.put(None)
        raise


def ratios(figures: dict[str, dict[str, dict[str, list[float]]]]) -> list[tuple[str, str, float | None, float]]:
    """(workload, what, EpisodeBuffer / Buffer, target) of every speed target (the
    default calls: ``Buffer out=`` is in :func:`benchmarks.report.default_vs_out`)."""
    def med(wl: str, metric: str, system: str) -> float | None:
        v = figures.get(wl, {}).get(metric, {}).get(system)
        return statistics.median(v) if v else None

    out = []
    for wl, metric, target, what in (
            ("mujoco", "sample 256", 0.7, "one-step sample"),
            ("mujoco", "sample 256, n_step=3", 0.5, "3-step sample"),
            ("mujoco", f"write {ENVS} envs per call (rows/s)", 0.6, f"write {ENVS} envs per call vs 8-row extend"),
            ("atari", "sample 256", 0.5, "frame_stack=4 sample")):
        a, b = med(wl, metric, "EpisodeBuffer"), med(wl, "sample 256" if "sample" in metric else metric, "Buffer")
        if a is not None or b is not None:
            out.append((wl, what, a / b if a and b else None, target))
    return out
