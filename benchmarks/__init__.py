"""``python -m benchmarks`` (``scripts/bench``): shmbuf side by side with its peers on the reference workloads.

Run it with ``scripts/bench`` (``--quick`` for a 3-minute version), which installs
the peers it compares against (cpprb) into the project's virtualenv.
"""

from __future__ import annotations

from typing import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    import argparse
    import sys

    from benchmarks import report
    from benchmarks import run

    p = argparse.ArgumentParser(prog="scripts/bench", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="3 short repeats: about 3 minutes")
    p.add_argument("--workloads", default="mujoco,atari")
    p.add_argument("--peers", default="shmbuf,shmbuf-py,cpprb,naive,numpy",
                   help="shmbuf-py: shmbuf's pure-Python path (left out of a workload whose "
                   "buffers do not all fit in memory)")
    p.add_argument("--torch", action="store_true",
                   help="also TorchRL's shared ReplayBuffer and stable-baselines3's (needs torch)")
    p.add_argument("--episodes", choices=("yes", "no", "only"), default="yes",
                   help="EpisodeBuffer beside Buffer on the same workloads (only: that part alone)")
    p.add_argument("--strategies", choices=("yes", "no", "only"), default="yes",
                   help="prioritized replay beside cpprb's, and hindsight relabelling (only: that part alone)")
    p.add_argument("--storage", choices=("yes", "no", "only"), default="no",
                   help="a buffer in a file against /dev/shm, against TorchRL's LazyMemmapStorage "
                   "larger than memory, and resume times (only: that part alone; see benchmarks.storage)")
    p.add_argument("--storage-dir", default=None, help="where the storage part's files go (default: $TMPDIR)")
    p.add_argument("--sweep", action="store_true",
                   help="only the figures the docs' plots draw: writers 1-4 and buffer sizes "
                   "(see benchmarks.sweep; scripts/plots draws its JSON)")
    p.add_argument("--ragged", action="store_true",
                   help="only the ragged workload: LLM rollouts (responses of 1..8,192 tokens) from 2 "
                   "generators to a trainer through shmbuf's queue, multiprocessing.Queue, "
                   "torch.multiprocessing.Queue and a raw memcpy (see benchmarks.ragged)")
    p.add_argument("--repeats", type=int)
    p.add_argument("--window", type=float, help="seconds per measurement window")
    p.add_argument("--e2e-window", type=float, help="seconds of each end-to-end window")
    p.add_argument("--results", default="results", help="folder for the JSON file")
    a = p.parse_args(argv)
    kw = {k: v for k, v in {"repeats": a.repeats, "window": a.window, "e2e_window": a.e2e_window}.items()
          if v is not None}
    peers = a.peers.split(",") + (["torchrl", "sb3"] if a.torch else [])
    peers = [p for p in peers if _installed(p)]
    if a.sweep:
        from benchmarks import sweep
        res = sweep.run([p for p in peers if p in ("shmbuf", "shmbuf-py", "cpprb", "naive", "numpy")], a.quick)
        print(sweep.markdown(res))
        print(f"\nsaved {sweep.save(res, a.results)}", file=sys.stderr)
        return 0
    if a.ragged:
        from benchmarks import ragged
        got = ragged.run(a.quick, a.window, a.repeats)
        print(ragged.markdown(got))
        print(f"\nsaved {ragged.save(got, a.results)}", file=sys.stderr)
        return 1 if ragged.failed(got) else 0
    if a.storage != "no":
        from benchmarks import storage
        stored = storage.run(a.storage_dir, a.quick)
        print(storage.markdown(stored) + "\n")
        print(f"saved {storage.save(stored, a.results)}", file=sys.stderr)
        if a.storage == "only":
            return 0
    cfg = run.Config.make(a.quick, workloads=tuple(a.workloads.split(",")), peers=tuple(peers),
                          episodes=a.episodes, strategies=a.strategies, **kw)
    res = run.run(cfg)
    text = report.markdown(res)
    print(text)
    path = run.save(res, a.results)
    with open(path.replace(".json", ".md"), "w") as f:
        f.write(text + "\n")
    print(f"\nsaved {path}", file=sys.stderr)
    return 0


# the peers that need a package of their own (scripts/bench installs cpprb; --torch the others)
PACKAGES = {"cpprb": "cpprb", "torchrl": "torchrl", "sb3": "stable_baselines3"}


def _installed(peer: str) -> bool:
    """Whether ``peer`` can run here; says on stderr which peer it leaves out, and why."""
    import importlib.util
    import sys

    pkg = PACKAGES.get(peer)
    if pkg is None or importlib.util.find_spec(pkg) is not None:
        return True
    print(f"scripts/bench: skipping the peer {peer}: the package {pkg} is not installed "
          f"(pip install '.[bench]' for cpprb; scripts/bench --torch installs torchrl and "
          f"stable-baselines3)", file=sys.stderr)
    return False
