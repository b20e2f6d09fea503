"""SB3's draws: a batch's rows picked with numpy's global generator exactly as SB3's
``ReplayBuffer.sample`` picks them, read through shmbuf's one read path.

SB3 draws ``np.random.randint(0, upper, size=n)`` for the steps (``upper``: its
``buffer_size`` once full, else its ``pos``), then ``np.random.randint(0, n_envs,
size=n)`` for the envs. The facade keeps env ``e``'s rows in lane ``e`` at the same
positions, so the same two calls name the same transitions: with the same global seed
(SB3's ``set_random_seed``, a model's ``seed=``), a script gets the same batches from the
facade as from SB3's buffer, and learns the same way. A lane that holds fewer rows than
the others (its env's process started later) is read from its oldest row: a step past
its rows is drawn again, as is a row being written (the checked gather), so every batch
is whole and uniform over the rows there are.

Examples:
    >>> import numpy as np, shmbuf
    >>> buf = shmbuf.Buffer.create({"x": ((), "int64")}, 8, lanes=2)
    >>> buf.add_each({"x": np.array([0, 100])}, [0, 1]); buf.add_each({"x": np.array([1, 101])}, [0, 1])
    >>> np.random.seed(0)
    >>> got = buf.engine.read(Draws(buf.engine), 4, 4, 1.0)["x"].tolist()
    >>> np.random.seed(0)
    >>> steps, envs = np.random.randint(0, 2, size=4), np.random.randint(0, 2, size=4)
    >>> got == (steps + 100 * envs).tolist()
    True
    >>> buf.close()
"""

from __future__ import annotations

from typing import Any

import numpy as np

from shmbuf.core import pool
from shmbuf.core.read import Sampler


class Draws(Sampler):
    """Rows drawn as SB3 draws them (see the module), for :func:`shmbuf.core.read.read`."""

    what = "transitions"

    def __init__(self, engine: Any) -> None:
        self.engine, self.fields = engine, engine.fields
        self.lc, self.lanes = engine.layout.lane_capacity, engine.layout.lanes

    def empty(self, m: int) -> dict[str, np.ndarray]:
        return pool.batch(self.fields, m)

    def draw(self, todo: np.ndarray, rounds: int, deadline: float) -> tuple[np.ndarray, np.ndarray]:
        lo, head = self.engine.window()
        lc, m = self.lc, len(todo)
        if self.lanes == 1 or ((head == head[0]).all() and (lo == lo[0]).all()):  # (the usual case: envs alike)
            held = min(int(head[0] - lo[0]), lc)
            if held == 0:
                raise ValueError("cannot sample from an empty replay buffer: add transitions first")
            step = np.random.randint(0, held, size=m)  # (SB3's two calls, in its order)
            lane = np.random.randint(0, high=self.lanes, size=(m,))
            return lane, (self.engine.rows_at(0, step, (lo, head)) if held == lc else step + int(lo[0]))  # full: the row there
        held = np.minimum(head - lo, lc)
        full = held == lc
        upper = lc if full.any() else int(held.max())
        if upper == 0:
            raise ValueError("cannot sample from an empty replay buffer: add transitions first")
        step = np.random.randint(0, upper, size=m)
        lane = np.random.randint(0, high=self.lanes, size=(m,))
        seq = np.where(full[lane], self.engine.rows_at(lane, step, (lo, head)), lo[lane] + step)
        return lane, np.where(step < held[lane], seq, -1)  # (past a lane's rows: -1, drawn again)

    def gather(self, drawn: tuple[np.ndarray, np.ndarray], out: dict[str, np.ndarray]) -> np.ndarray | None:
        lane, seq = drawn
        there = seq >= 0
        if there.all():
            return self.engine.gather(lane if self.lanes > 1 else 0, seq, 1, list(out.values()))
        ok = np.zeros(len(seq), bool)
        if there.any():
            part = {k: v[there] for k, v in out.items()}
            got = self.engine.gather(lane[there], seq[there], 1, list(part.values()))
            for k, v in part.items():
                out[k][there] = v
            ok[there] = True if got is None else got
        return ok
