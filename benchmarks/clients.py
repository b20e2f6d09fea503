"""What a CleanRL user gets: ``examples/cleanrl_dqn.py`` (CleanRL's DQN on CartPole with
SB3's ReplayBuffer) against the same file with its one ReplayBuffer import changed to
shmbuf's, and against ``examples/cleanrl_dqn_actors.py`` (the same DQN made asynchronous
with :class:`shmbuf.Actors`). Each seed runs every arm, the arms' order rotating from
seed to seed, one run at a time, torch on one thread (``OMP_NUM_THREADS=1``: on 2 cores
two threads per process make runs vary by several times); the report gives medians
and ratios. Run nothing else meanwhile.

    scripts/bench-clients                 # 5 seeds, 150k steps
    scripts/bench-clients --seeds 3 --steps 60000
    scripts/bench-clients --loops         # CleanRL's DQN, SAC and TD3, each with its one import switched

``--loops`` runs ``examples/cleanrl_{dqn,sac,td3}.py`` unchanged and switched (the one
ReplayBuffer import), the two arms of each seed one after the other, the first arm
alternating from seed to seed, and reports the training loop's CPU time (and wall time,
and the time inside the buffer's calls) of the switched script over the original's,
per seed and their median, with each arm's learning curve (``results/loops.json``;
``scripts/plots`` draws it).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

SB3_IMPORT = "from stable_baselines3.common.buffers import ReplayBuffer\n"
SHMBUF_IMPORT = "from shmbuf.compat.sb3 import ReplayBuffer\n"


# the CleanRL scripts of --loops, and their arguments (Pendulum learns in these steps)
LOOPS = {"dqn": ["--total-timesteps", "60000", "--exploration-fraction", "0.5"],
         "sac": ["--total-timesteps", "8000"], "td3": ["--total-timesteps", "10000"]}


def switched(script: Path, workdir: Path) -> Path:
    """A copy of ``script`` with its one ReplayBuffer import changed to shmbuf's."""
    original = script.read_text()
    if original.count(SB3_IMPORT) != 1:
        raise SystemExit(f"{script} no longer has the line {SB3_IMPORT.strip()!r}")
    copy = workdir / f"{script.stem}_shmbuf.py"
    copy.write_text(original.replace(SB3_IMPORT, SHMBUF_IMPORT))
    return copy


def arms(examples: Path, workdir: Path) -> dict[str, list[str]]:
    """The command of each arm (the shmbuf arm: a copy of the script, one line changed)."""
    return {"CleanRL + SB3's buffer": [str(examples / "cleanrl_dqn.py")],
            "CleanRL + shmbuf (1 import)": [str(switched(examples / "cleanrl_dqn.py", workdir))],
            "async: shmbuf.Actors, 2 x 4 envs": [str(examples / "cleanrl_dqn_actors.py")]}


def loops(examples: Path, seeds: int, first: int = 1) -> dict[str, Any]:
    """``--loops``: each script's two arms per seed, one after the other, the first
    alternating. Returns the runs, by script and arm."""
    import platform
    import time

    import numpy as np

    got: dict[str, Any] = {"kind": "loops", "args": LOOPS, "runs": {},
                           "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                       "numpy": np.__version__, "date": time.strftime("%Y-%m-%d %H:%M:%S")}}
    with tempfile.TemporaryDirectory() as tmp:
        for name, extra in LOOPS.items():
            script = examples / f"cleanrl_{name}.py"
            cmds = {"sb3": [str(script), *extra], "shmbuf": [str(switched(script, Path(tmp))), *extra]}
            runs: dict[str, list[dict[str, Any]]] = {"sb3": [], "shmbuf": []}
            for seed in range(first, first + seeds):
                for arm in (("sb3", "shmbuf") if seed % 2 else ("shmbuf", "sb3")):
                    r = _run(cmds[arm], seed)
                    print(f"{name} seed {seed}: {arm}: cpu {r['cpu_s']} s, wall {r['wall_s']} s, "
                          f"in the buffer {r['buffer_s']} s", file=sys.stderr, flush=True)
                    runs[arm].append(r)
            got["runs"][name] = runs
    return got


def loops_report(got: dict[str, Any]) -> str:
    lines = ["CleanRL's scripts, unchanged (SB3's buffer) and with the one import switched (shmbuf), "
             "the arms of each seed one after the other; ratios: shmbuf / SB3 per seed, their median "
             "(and range)", "",
             "| script | steps | seeds | CPU s SB3 | CPU s shmbuf | CPU ratio | wall ratio | in the buffer s SB3 / shmbuf "
             "| last return SB3 / shmbuf |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, runs in got["runs"].items():
        a, b = runs["sb3"], runs["shmbuf"]

        def ratio(key: str) -> str:
            rs = [y[key] / x[key] for x, y in zip(a, b)]
            return f"{statistics.median(rs):.3f} ({min(rs):.3f}-{max(rs):.3f})"

        def med(arm: list[dict[str, Any]], key: str) -> float:
            return statistics.median(r[key] for r in arm)

        last = [median([r["curve"][-1] for r in arm]) for arm in (a, b)]
        lines.append(f"| {name} | {got['args'][name][1]} | {len(a)} | {med(a, 'cpu_s'):.1f} | {med(b, 'cpu_s'):.1f} | "
                     f"{ratio('cpu_s')} | {ratio('wall_s')} | {med(a, 'buffer_s'):.2f} / {med(b, 'buffer_s'):.2f} | "
                     f"{_fmt(last[0])} / {_fmt(last[1])} |")
    return "\n".join(lines)


def _run(cmd: list[str], seed: int, timeout: float = 1800) -> dict[str, Any]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # torch on one thread in every arm: steadier on 2 cores
    res = subprocess.run([sys.executable, *cmd, "--seed", str(seed)], capture_output=True, text=True,
                         timeout=timeout, env=env)
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def run(cmd: list[str], seed: int, steps: int, seconds: float) -> dict[str, Any]:
    """One run. Every arm decays epsilon over the same 30,000 steps (CleanRL's schedule:
    exploration_fraction * total_timesteps); the synchronous arms run ``steps`` steps, the
    asynchronous one until solved or ``seconds``."""
    if cmd[0].endswith("actors.py"):
        extra = ["--total-timesteps", "60000", "--exploration-fraction", "0.5", "--seconds", str(seconds)]
    else:
        extra = ["--total-timesteps", str(steps), "--exploration-fraction", str(30_000 / steps)]
    return _run([*cmd, *extra], seed, seconds + 600)


def median(values: list[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return statistics.median(got) if got else None


def solved_median(runs: list[dict[str, Any]]) -> float:
    """The median time to solve, a run that never solved counting as slower than all."""
    return statistics.median([math.inf if r["solved_s"] is None else r["solved_s"] for r in runs])


def report(results: dict[str, list[dict[str, Any]]], steps: int) -> str:
    names = list(results)
    base = results[names[0]]
    lines = [f"CleanRL's DQN on CartPole-v1, seeds {[r['seed'] for r in base]}: the synchronous arms run "
             f"{steps:,} steps, the asynchronous one until solved (medians; solved: the mean of the last 20 "
             "returns >= 475, a run that never did counting as the slowest; epsilon decays over 30,000 steps in every arm)", "",
             "| arm | wall s | steps/s | solved in s | solved runs | last-20 return |",
             "|---|---:|---:|---:|---:|---:|"]
    for name, rs in results.items():
        solved, wall = solved_median(rs), median([r["wall_s"] for r in rs])
        lines.append(f"| {name} | {wall:.1f} | {median([r['sps'] for r in rs]):,.0f} | "
                     f"{'> %.1f' % wall if math.isinf(solved) else '%.1f' % solved} | "
                     f"{sum(r['solved_s'] is not None for r in rs)}/{len(rs)} | "
                     f"{_fmt(median([r['last20'] for r in rs]))} |")
    sb3, shm, asy = (results[n] for n in names)
    loop = median([b["wall_s"] / a["wall_s"] for a, b in zip(sb3, shm)])
    lines += ["", f"shmbuf / SB3 loop time (per seed, median): {loop:.2f}"]
    a, s = solved_median(asy), solved_median(sb3)
    if not math.isinf(a) and not math.isinf(s):
        lines.append(f"time to solve, async / CleanRL's original: {a:.1f} s / {s:.1f} s = {a / s:.2f}")
    return "\n".join(lines)


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=None, help="5 (--loops: 2)")
    p.add_argument("--first-seed", type=int, default=1, help="--loops: the first seed")
    p.add_argument("--steps", type=int, default=150_000, help="the synchronous arms' steps")
    p.add_argument("--seconds", type=float, default=120.0, help="the async arm's time limit")
    p.add_argument("--examples", type=Path, default=Path(__file__).resolve().parents[1] / "examples")
    p.add_argument("--out", type=Path, default=Path("results"))
    p.add_argument("--calls", action="store_true",
                   help="only SB3's buffer and the facade call by call (benchmarks/sb3calls.py)")
    p.add_argument("--loops", action="store_true",
                   help="CleanRL's DQN, SAC and TD3, each unchanged and with its import switched (CPU time)")
    a = p.parse_args(argv)
    if a.loops:
        got = loops(a.examples, a.seeds or 2, a.first_seed)
        text = loops_report(got)
        print(text)
        os.makedirs(a.out, exist_ok=True)
        (a.out / "loops.md").write_text(text + "\n")
        (a.out / "loops.json").write_text(json.dumps(got, indent=1))
        return
    if a.calls:
        from benchmarks import sb3calls

        rows = sb3calls.measure()
        print(sb3calls.markdown(rows))
        os.makedirs(a.out, exist_ok=True)
        (a.out / "sb3calls.json").write_text(json.dumps(rows, indent=1))
        return
    with tempfile.TemporaryDirectory() as tmp:
        cmds = arms(a.examples, Path(tmp))
        names = list(cmds)
        results: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
        for i, seed in enumerate(range(1, (a.seeds or 5) + 1)):
            for name in names[i % len(names):] + names[:i % len(names)]:  # the order rotates
                got = run(cmds[name], seed, a.steps, a.seconds)
                print(f"seed {seed}: {name}: {got}", file=sys.stderr, flush=True)
                results[name].append(got)
        for rs in results.values():
            rs.sort(key=lambda r: r["seed"])
    text = report(results, a.steps)
    print(text)
    os.makedirs(a.out, exist_ok=True)
    (a.out / "clients.md").write_text(text + "\n")
    (a.out / "clients.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
