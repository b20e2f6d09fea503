"""What a benchmark run is asked (:class:`Config`) and what it gives (:class:`Results`),
and the loop that times a call in this process."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any



@dataclass
class Config:
    quick: bool = False
    workloads: tuple[str, ...] = ("mujoco", "atari")
    peers: tuple[str, ...] = ("shmbuf", "shmbuf-py", "cpprb", "naive", "numpy")
    # peers dropped first, in this order, when a workload's buffers do not all fit in memory
    optional: tuple[str, ...] = ("sb3", "torchrl", "shmbuf-py")
    repeats: int = 5
    window: float = 1.0
    e2e_window: float = 10.0
    e2e_repeats: int = 3
    progress: bool = True
    episodes: str = "yes"  # the EpisodeBuffer part (bench/episodes.py): yes, no, only
    strategies: str = "yes"  # priorities and hindsight (bench/strategies.py): yes, no, only
    learner_first: bool = True  # shmbuf with a rate limit, writers beside a learner (bench/learner.py)

    @classmethod
    def make(cls, quick: bool, **kw: Any) -> "Config":
        if quick:
            kw = {"repeats": 3, "window": 0.3, "e2e_window": 0.6, "e2e_repeats": 2, **kw}
        return cls(quick=quick, **kw)


@dataclass
class Results:
    config: dict[str, Any]
    machine: dict[str, Any]
    # figures[workload][metric][system] = list of values, one per repeat
    figures: dict[str, dict[str, dict[str, list[float]]]] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    def add(self, wl: str, metric: str, system: str, value: float) -> None:
        self.figures.setdefault(wl, {}).setdefault(metric, {}).setdefault(system, []).append(value)

    def median(self, wl: str, metric: str, system: str) -> float | None:
        vals = self.figures.get(wl, {}).get(metric, {}).get(system)
        return statistics.median(vals) if vals else None


def local_loop(fn: Any, seconds: float) -> float:
    """Calls per second of ``fn`` in this process."""
    n = 0
    t0 = time.perf_counter()
    deadline = t0 + seconds
    while True:
        for _ in range(8):
            fn()
        n += 8
        if time.perf_counter() >= deadline:
            return n / (time.perf_counter() - t0)


# -- the measurement plan ----------------------------------------------------------------
