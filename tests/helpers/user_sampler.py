"""A user's own sampler class, in an importable module (what ``sampler=Class`` records
by its import path ``helpers.user_sampler:Stride``), and the child that attaches."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

import shmbuf
from shmbuf.core import read
from shmbuf.samplers.uniform import Uniform


class Stride(Uniform):
    """The ``n`` rows ``0, step, 2 * step, ...`` of lane 0's window (a toy, but one
    that draws through the read path and takes an option)."""


    @classmethod
    def options(cls, given: Mapping[str, Any]) -> dict[str, Any]:
        extra = set(given) - {"step"}
        if extra:
            raise ValueError(f"Stride takes the option 'step' only, got {sorted(extra)}")
        step = given.get("step", 1)
        if isinstance(step, bool) or not isinstance(step, int) or step < 1:
            raise ValueError(f"step must be an int >= 1, got {step!r}")
        return {"step": step}

    def __init__(self, engine: Any, outputs: Any, step: int) -> None:
        super().__init__(engine, outputs)
        self.step = step

    def sample(self, n: int, out: Any, timeout: Any, beta: Any) -> dict[str, np.ndarray]:
        return self.engine.read(_Rows(self), n, n, timeout)


class _Rows(read.Sampler):
    """Stride's draw for the read path: lane 0's rows ``lo, lo + step, ...`` (a row that
    is not intact is drawn again, from a new look at the window)."""

    def __init__(self, s: Stride) -> None:
        self.s = s

    def empty(self, m: int) -> dict[str, np.ndarray]:
        return self.s.outputs.empty((m,))

    def draw(self, todo: np.ndarray, rounds: int, deadline: float) -> np.ndarray:
        lo, head = self.s.engine.window()
        if head[0] - lo[0] <= self.s.step * todo[-1]:
            raise ValueError(f"lane 0 holds {int(head[0] - lo[0])} rows, fewer than the stride needs")
        return int(lo[0]) + self.s.step * todo.astype(np.int64)

    def gather(self, drawn: np.ndarray, out: dict[str, np.ndarray]) -> np.ndarray | None:
        return self.s.engine.gather(np.zeros(len(drawn), np.int64), drawn, 1,
                                    [out[k] for k in self.s.outputs.names])


def sample_attached(name: str, n: int, conn: Any) -> None:
    """In a child: attach by name, send the sampler's class name and a sample's ``x``."""
    with shmbuf.Buffer.attach(name) as buf:
        conn.send((type(buf.sampler).__name__, buf.sample(n)["x"].tolist(), buf.parts.specs))


__all__ = ["Stride", "sample_attached"]
