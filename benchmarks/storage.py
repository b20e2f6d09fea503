"""``scripts/bench --storage only``: a buffer in a file against the same buffer in /dev/shm,
against TorchRL's ``LazyMemmapStorage`` when the file is larger than the memory a
process may use, and the time to resume a run by re-attaching against ``save`` + ``load``.

Three parts, each compared in one run (the two sides interleaved round by round, the
machine is shared and noisy, so the ratios are what to read):

1. **cached file vs /dev/shm**: rows/s of ``extend`` (chunks of 64) and of ``sample``
   (batches of 256) on the mujoco (1M rows) and atari (20,000 rows) workloads, the
   file's pages in the page cache; and mujoco on 20,000 rows, where the file's horizon
   (an ``msync`` per sixteenth of a lane, see :mod:`shmbuf.core.durable`) costs most.
2. **larger than memory**: a child process in a memory cgroup limited to a quarter of
   the file fills it and samples it; TorchRL's ``LazyMemmapStorage`` (its
   ``ReplayBuffer``) does the same with the same rows on the same file system. Needs
   root and a memory cgroup, and torchrl; the part says why it was skipped otherwise.
3. **resume**: a 1M-row mujoco buffer is opened again by ``Buffer.attach(path)``
   (and one batch sampled) against ``Buffer.load`` of a ``save`` of it.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from typing import Any

import numpy as np

import shmbuf
from shmbuf.core import files

from benchmarks.peers import BATCH, WORKLOADS


def _rates(buf: shmbuf.Buffer, data: dict[str, np.ndarray], seconds: float) -> tuple[float, float]:
    """(rows added per s, rows sampled per s) over about ``seconds`` each."""
    n = len(next(iter(data.values())))
    added, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for lo in range(0, n, 64):
            buf.extend({k: v[lo:lo + 64] for k, v in data.items()})
        added += n
    add = added / (time.perf_counter() - t0)
    out = buf.empty_batch(BATCH)
    sampled, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(20):
            buf.sample(BATCH, out=out)
        sampled += 20 * BATCH
    return add, sampled / (time.perf_counter() - t0)


def cached(where: str, rounds: int, seconds: float) -> list[dict[str, Any]]:
    """Part 1: the file's figures over /dev/shm's, per workload (medians of the rounds)."""
    rows = []
    mujoco, atari = WORKLOADS["mujoco"], WORKLOADS["atari"]
    for wl, capacity in ((mujoco, min(mujoco.capacity, 1_000_000)), (atari, min(atari.capacity, 20_000)),
                         (mujoco, min(mujoco.capacity, 20_000))):
        data = wl.data(4096, 0)
        got: dict[str, list[tuple[float, float]]] = {"shm": [], "file": []}
        path = os.path.join(where, f"bench-{os.getpid()}.shmbuf")
        with shmbuf.Buffer.create(wl.fields, capacity) as shm, \
                shmbuf.Buffer.create(wl.fields, capacity, path=path) as f:
            try:
                for buf in (shm, f):  # warm: a lap and more, every page mapped and in the cache
                    for lo in range(0, capacity + 4096, 64):
                        buf.extend({k: v[lo % 4096:lo % 4096 + 64] for k, v in data.items()})
                for _ in range(rounds):
                    got["shm"].append(_rates(shm, data, seconds))
                    got["file"].append(_rates(f, data, seconds))
            finally:
                f.unlink()
        med = {k: (statistics.median(a for a, _ in v), statistics.median(s for _, s in v)) for k, v in got.items()}
        rows.append({"workload": wl.name, "rows": capacity, "add shm": med["shm"][0], "add file": med["file"][0],
                     "sample shm": med["shm"][1], "sample file": med["file"][1]})
    return rows


CHILD = """
    import os, sys, time, json
    cg = sys.argv[1]
    with open(os.path.join(cg, "cgroup.procs"), "w") as f:
        f.write(str(os.getpid()))
    import numpy as np
    which, path, rows, seconds, budget = sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5]), int(sys.argv[6])
    if which == "torchrl":
        import torch, tensordict, torchrl.data
    else:
        import shmbuf
    # the limit: what this process uses with its imports done, plus the same budget for both
    v1 = os.path.exists(os.path.join(cg, "memory.usage_in_bytes"))
    with open(os.path.join(cg, "memory.usage_in_bytes" if v1 else "memory.current")) as f:
        used = int(f.read())
    with open(os.path.join(cg, "memory.limit_in_bytes" if v1 else "memory.max"), "w") as f:
        f.write(str(used + budget))
    frame = (84, 84)
    rng = np.random.default_rng(0)
    chunk = 256
    obs = rng.integers(0, 255, (chunk,) + frame, dtype=np.uint8)
    if which == "shmbuf":
        import shmbuf
        buf = shmbuf.Buffer.create({"obs": (frame, "uint8"), "action": ((), "int64")}, rows, path=path)
        for lo in range(0, rows, chunk):
            buf.extend({"obs": obs, "action": np.arange(lo, lo + chunk)})
        sample = lambda: buf.sample(32)
    else:
        import torch
        from tensordict import TensorDict
        from torchrl.data import LazyMemmapStorage, ReplayBuffer
        rb = ReplayBuffer(storage=LazyMemmapStorage(rows, scratch_dir=path), batch_size=32)
        t_obs = torch.from_numpy(obs)
        for lo in range(0, rows, chunk):
            rb.extend(TensorDict({"obs": t_obs, "action": torch.arange(lo, lo + chunk)}, batch_size=[chunk]))
        sample = rb.sample
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        sample()
        n += 32
    print(json.dumps({"samples_per_s": n / (time.perf_counter() - t0)}))
"""


def _cgroup(limit: int) -> str | None:
    """A memory cgroup (v1, else v2) limited to ``limit`` bytes, or None if none can be made."""
    for root, knob in (("/sys/fs/cgroup/memory", "memory.limit_in_bytes"), ("/sys/fs/cgroup", "memory.max")):
        d = os.path.join(root, f"shmbuf-bench-{os.getpid()}")
        try:
            os.mkdir(d)
            with open(os.path.join(d, knob), "w") as f:
                f.write(str(limit))
            return d
        except OSError:
            try:
                os.rmdir(d)
            except OSError:
                pass
    return None


def larger_than_memory(where: str, limit_mib: int, seconds: float) -> dict[str, Any]:
    """Part 2: samples/s of a file four times the memory a process may use beyond what
    its imports take (a cgroup's limit, set by the child once it has imported), both
    systems."""
    rows = 4 * limit_mib * 2**20 // (84 * 84)
    out: dict[str, Any] = {"limit MiB": limit_mib, "file MiB": rows * 84 * 84 // 2**20, "rows": rows}
    fs = files.filesystem(where)
    if fs in ("tmpfs", "ramfs"):
        return {**out, "skipped": f"{where} is in memory ({fs}): pass --storage-dir on a disk"}
    cg = _cgroup(8 << 30)  # (lowered by the child)
    if cg is None:
        return {**out, "skipped": "no memory cgroup can be made here (needs root and the memory controller)"}
    try:
        for which in ("shmbuf", "torchrl"):
            if which == "torchrl":
                try:
                    import tensordict  # noqa: F401
                    import torchrl  # noqa: F401
                except ImportError:
                    out["torchrl"] = "not installed (scripts/bench --torch installs it)"
                    continue
            d = tempfile.mkdtemp(dir=where)
            try:
                path = os.path.join(d, "b.shmbuf") if which == "shmbuf" else d
                res = subprocess.run([sys.executable, "-c", textwrap.dedent(CHILD), cg, which, path,
                                      str(rows), str(seconds), str(limit_mib * 2**20)],
                                     capture_output=True, text=True, timeout=1800)
                out[which] = (float(json.loads(res.stdout.splitlines()[-1])["samples_per_s"])
                              if res.returncode == 0 else "killed by the OOM killer" if res.returncode == -9
                              else f"failed ({res.returncode}): {res.stderr[-300:]}")
            finally:
                shutil.rmtree(d, ignore_errors=True)
    finally:
        for _ in range(100):  # (a killed child leaves it busy until it is reaped)
            try:
                os.rmdir(cg)
                break
            except OSError:
                time.sleep(0.1)
    return out


def resume(where: str, rows: int, rounds: int) -> dict[str, Any]:
    """Part 3: seconds to have the run back (a batch sampled) by attach vs save + load."""
    wl = WORKLOADS["mujoco"]
    d = tempfile.mkdtemp(dir=where)
    path = os.path.join(d, "run.shmbuf")
    times: dict[str, list[float]] = {"attach": [], "save": [], "load": []}
    try:
        with shmbuf.Buffer.create(wl.fields, rows, path=path) as buf:
            data = wl.data(4096, 0)
            for _ in range(rows // 4096):
                buf.extend(data)
            buf.flush()
            for i in range(rounds):
                t0 = time.perf_counter()
                with shmbuf.Buffer.attach(path) as again:
                    again.sample(BATCH)
                times["attach"].append(time.perf_counter() - t0)
                save = os.path.join(d, f"save{i}")
                t0 = time.perf_counter()
                buf.save(save, progress=False)
                times["save"].append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                with shmbuf.Buffer.load(save, name=f"bench-resume-{os.getpid()}", progress=False) as loaded:
                    loaded.sample(BATCH)
                    loaded.unlink()
                times["load"].append(time.perf_counter() - t0)
                shutil.rmtree(save)
            buf.unlink()
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return {"rows": rows, **{k: statistics.median(v) for k, v in times.items()}}


def markdown(res: dict[str, Any]) -> str:
    out = ["### A buffer in a file (cached) against the same buffer in /dev/shm", "",
           "| workload | rows | add rows/s shm | add rows/s file | file/shm | sample rows/s shm | sample rows/s file | file/shm |",
           "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in res["cached"]:
        out.append(f"| {r['workload']} | {r['rows']:,} | {r['add shm']:,.0f} | {r['add file']:,.0f} | "
                   f"{r['add file'] / r['add shm']:.2f} | {r['sample shm']:,.0f} | {r['sample file']:,.0f} | "
                   f"{r['sample file'] / r['sample shm']:.2f} |")
    big = res["larger"]
    out += ["", f"### Larger than memory: {big['file MiB']:,} MiB of 84x84 frames, each process limited to "
            f"{big['limit MiB']} MiB beyond its imports", ""]
    if "skipped" in big:
        out.append(f"skipped: {big['skipped']}")
    else:
        def cell(v: Any) -> str:
            return f"{v:,.0f}" if isinstance(v, float) else str(v)
        out += ["| system | samples/s (batches of 32) |", "|---|---:|",
                f"| shmbuf (file) | {cell(big.get('shmbuf'))} |", f"| TorchRL LazyMemmapStorage | {cell(big.get('torchrl'))} |"]
        if isinstance(big.get("shmbuf"), float) and isinstance(big.get("torchrl"), float):
            out.append(f"\nshmbuf / TorchRL: {big['shmbuf'] / big['torchrl']:.2f}x")
    r = res["resume"]
    out += ["", f"### Resuming a {r['rows']:,}-row run (mujoco rows)", "",
            "| how | seconds |", "|---|---:|",
            f"| Buffer.attach(path) + one batch | {r['attach']:.3f} |",
            f"| save (before the stop) | {r['save']:.3f} |",
            f"| Buffer.load + one batch | {r['load']:.3f} |",
            "", f"attach is {r['load'] / r['attach']:,.0f}x faster than load "
            f"({(r['save'] + r['load']) / r['attach']:,.0f}x than save + load)"]
    return "\n".join(out)


def save(res: dict[str, Any], folder: str) -> str:
    """Write the figures as JSON under ``folder``; returns the path."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"bench-storage-{time.strftime('%Y%m%d-%H%M%S')}.json")
    with open(path, "w") as f:
        json.dump(res, f, indent=1)
    return path


def run(where: str | None = None, quick: bool = False) -> dict[str, Any]:
    where = where or tempfile.gettempdir()
    return {"where": where,
            "cached": cached(where, 3 if quick else 7, 0.3 if quick else 1.0),
            "larger": larger_than_memory(where, 64 if quick else 256, 5.0 if quick else 20.0),
            "resume": resume(where, 1_000_000, 1 if quick else 3)}
