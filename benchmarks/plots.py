"""Draws a benchmark run's JSON as PNG plots (``scripts/plots FILE.json... --out DIR``;
``scripts/docs`` draws the docs' recorded runs this way). Needs matplotlib.

* a sweep (``scripts/bench --sweep``): ``writers.png`` and ``writers-atari.png`` (ingest
  and the learner's batches per second against writer processes) and ``capacity.png`` (microseconds per
  ``sample(256)`` against the buffer's capacity);
* a main run (``scripts/bench``): ``<workload>-ratios.png``, shmbuf's figure over each
  peer's, per metric;
* CleanRL's loops (``scripts/bench-clients --loops``): ``loops.png``, each script's
  learning curve with SB3's buffer and with shmbuf's, seed by seed;
* LLM RL rollouts (``scripts/bench-ragged``): ``llm.png``, each system's verified tokens
  per second and its trainer's CPU per million tokens (its best knob; the rounds' median,
  the bar's whisker their range).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from typing import Any, Sequence

STYLE = {"shmbuf": ("tab:blue", "o"), "shmbuf-py": ("tab:cyan", "s"), "cpprb": ("tab:red", "^"),
         "naive": ("tab:gray", "v"), "numpy": ("black", "D"), "torchrl": ("tab:orange", "P"),
         "sb3": ("tab:green", "X"), "shmbuf-lf": ("tab:purple", "*")}
LABEL = {"shmbuf": "shmbuf (C extension)", "shmbuf-py": "shmbuf (pure Python)",
         "cpprb": "cpprb MPReplayBuffer", "naive": "multiprocessing.Queue + numpy ring",
         "numpy": "numpy ring, one process (no IPC)",
         "shmbuf-lf": "shmbuf, learner first (RateLimit)"}


def _title(res: dict[str, Any]) -> str:
    m = res["machine"]
    return f"{m['cpus']} cores, Python {m['python']}, numpy {m['numpy']}, {m['date'][:10]}"


def _series(ax: Any, per_peer: dict[str, dict[str, list[float]]], ylabel: str) -> None:
    for peer, by_x in per_peer.items():
        xs = sorted(by_x, key=float)
        med = [statistics.median(by_x[x]) for x in xs]
        lo = [min(by_x[x]) for x in xs]
        hi = [max(by_x[x]) for x in xs]
        color, marker = STYLE.get(peer, ("tab:purple", "."))
        ax.plot([float(x) for x in xs], med, marker=marker, color=color, label=LABEL.get(peer, peer))
        ax.fill_between([float(x) for x in xs], lo, hi, color=color, alpha=0.15)
    ax.set_ylabel(ylabel)
    ax.set_yscale("log")
    ax.grid(True, which="both", alpha=0.3)


def _writers(res: dict[str, Any], key: str, what: str, path: str, plt: Any) -> str:
    """Ingest and the learner's batches per second against writer processes."""
    w = res[key]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    _series(a, {p: v["ingest"] for p, v in w.items()}, "rows written per second (64 a call)")
    _series(b, {p: v["batches"] for p, v in w.items()}, "learner: sample(256) per second")
    for ax in (a, b):
        ax.set_xlabel("writer processes")
        ax.set_xticks([1, 2, 3, 4])
    a.set_title("ingest, while the learner samples")
    b.set_title("the learner, while they write")
    b.legend(fontsize=8)
    fig.suptitle(f"{what}; median and range of repeats ({_title(res)})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def sweep(res: dict[str, Any], out: str, plt: Any) -> list[str]:
    paths = [_writers(res, "writers", "mujoco rows (165 B), 262,144 capacity", os.path.join(out, "writers.png"), plt)]
    if "writers atari" in res:
        paths.append(_writers(res, "writers atari", "atari rows (56 kB), 50,000 capacity",
                              os.path.join(out, "writers-atari.png"), plt))
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    _series(ax, res["capacity"], "microseconds per sample(256)")
    ax.set_xscale("log")
    ax.set_xlabel("buffer capacity (rows)")
    ax.set_title(f"the cost of a sample as the buffer grows\n({_title(res)})", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    paths.append(os.path.join(out, "capacity.png"))
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths


def ratios(res: dict[str, Any], out: str, plt: Any) -> list[str]:
    paths = []
    for wl, metrics in res["figures"].items():
        peers = [p for p in ("cpprb", "naive", "numpy", "torchrl", "sb3")
                 if any(p in by for by in metrics.values())]
        names = [m for m, by in metrics.items() if "shmbuf" in by and any(p in by for p in peers)]
        fig, ax = plt.subplots(figsize=(9, 0.45 * len(names) + 1.5))
        height = 0.8 / max(len(peers), 1)
        for i, p in enumerate(peers):
            ys, vals = [], []
            for j, m in enumerate(names):
                if p in metrics[m] and metrics[m][p] and metrics[m]["shmbuf"]:
                    ys.append(j + i * height)
                    vals.append(statistics.median(metrics[m]["shmbuf"]) / statistics.median(metrics[m][p]))
            ax.barh(ys, vals, height=height, color=STYLE[p][0], label=f"over {LABEL.get(p, p)}")
        ax.axvline(1.0, color="black", lw=0.8)
        ax.set_xscale("log")
        ax.set_yticks([j + 0.4 - height / 2 for j in range(len(names))], names)
        ax.invert_yaxis()
        ax.set_xlabel("shmbuf's figure over the peer's (higher is better for shmbuf)")
        ax.set_title(f"{wl}: {_title(res)}", fontsize=9)
        ax.legend(fontsize=8)
        fig.tight_layout()
        paths.append(os.path.join(out, f"{wl}-ratios.png"))
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    return paths


def loops(res: dict[str, Any], out: str, plt: Any) -> list[str]:
    names = list(res["runs"])
    fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 3.6))
    for ax, name in zip(axes, names):
        for arm, color in (("sb3", STYLE["sb3"][0]), ("shmbuf", STYLE["shmbuf"][0])):
            for i, run in enumerate(res["runs"][name][arm]):
                xs = [1000 * (k + 1) for k, v in enumerate(run["curve"]) if v is not None]
                ax.plot(xs, [v for v in run["curve"] if v is not None], color=color, alpha=0.8,
                        ls="-" if i % 2 == 0 else "--",
                        label=f"{'SB3' if arm == 'sb3' else 'shmbuf'}'s buffer, seed {run['seed']}")
        ax.set_title(f"CleanRL {name} ({'CartPole' if name == 'dqn' else 'Pendulum'})", fontsize=9)
        ax.set_xlabel("environment steps")
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("mean episodic return per 1,000 steps")
    axes[-1].legend(fontsize=7)
    fig.suptitle(f"the same scripts, one import apart ({_title(res)})", fontsize=9)
    fig.tight_layout()
    path = os.path.join(out, "loops.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


def llm(res: dict[str, Any], out: str, plt: Any) -> list[str]:
    best = res["best"]  # system -> its best knob's arm (benchmarks.llm.summary)
    runs = {s: [r for r in res["arms"][a] if "error" not in r] for s, a in best.items()}
    systems = sorted(best, key=lambda s: -statistics.median(r["tokens/s"] for r in runs[s]))
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 0.42 * len(systems) + 1.6), sharey=True)
    for ax, key, scale, label in ((a, "tokens/s", 1e-6, "verified response tokens per second (millions)"),
                                  (b, "cpu s per M tokens", 1.0, "trainer CPU seconds per million tokens")):
        vals = [[r[key] * scale for r in runs[s]] for s in systems]
        med = [statistics.median(v) for v in vals]
        err = [[m - min(v) for m, v in zip(med, vals)], [max(v) - m for m, v in zip(med, vals)]]
        colors = [STYLE["shmbuf"][0] if s.startswith("shmbuf") else "black" if s.startswith("memcpy")
                  else "tab:gray" for s in systems]
        ax.barh(range(len(systems)), med, xerr=err, color=colors, capsize=3)
        ax.set_xlabel(label)
        ax.grid(True, axis="x", alpha=0.3)
    a.set_yticks(range(len(systems)), systems, fontsize=8)
    a.invert_yaxis()
    c = res["config"]
    fig.suptitle(f"LLM RL rollouts, 2 generators -> 1 trainer, batches <= {c['budget tokens']:,} tokens, "
                 f"max_staleness={c['max staleness']} ({c['rounds']} rounds; {_title(res)})", fontsize=9)
    fig.tight_layout()
    path = os.path.join(out, "llm.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/plots", description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="+", help="JSON files of scripts/bench (a main run or --sweep)")
    p.add_argument("--out", default="results/plots", help="folder for the PNG files")
    a = p.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(a.out, exist_ok=True)
    for f in a.files:
        with open(f) as fh:
            res = json.load(fh)
        made = {"sweep": sweep, "loops": loops, "llm": llm}.get(res.get("kind"), ratios)(res, a.out, plt)
        for path in made:
            print(f"scripts/plots: {f} -> {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
