"""The default sampler: rows uniformly, with replacement, over all published rows (the
shape every sampler has: :mod:`shmbuf.samplers`).

Examples:
    >>> import numpy as np, shmbuf
    >>> buf = shmbuf.Buffer.create({"x": ((), "int64")}, 8, seed=0)
    >>> buf.extend({"x": np.arange(8)})
    >>> type(buf.sampler).__name__, buf.sampler.sample(3, None, None, None)["x"].shape
    ('Uniform', (3,))
    >>> buf.close()
"""

from __future__ import annotations

from typing import Any

import numpy as np

from shmbuf.core.batch import Batch, Outputs
from shmbuf.core.engine import Engine


class Uniform:
    """Rows uniformly, with replacement, over all published rows."""


    def __init__(self, engine: Engine, outputs: Outputs) -> None:
        self.engine, self.outputs = engine, outputs

    def sample(self, n: int, out: Batch | None, timeout: float | None, beta: Any) -> Batch:
        if beta is not None:
            raise ValueError("beta= is for a prioritized buffer: create it with priority=<exponent>")
        out, arrays = self.outputs.prepare(out, (n,))
        self.engine.sample_windows(n, 1, arrays, timeout)
        return out

    def update(self, index: Any, priorities: Any, timeout: float) -> int:
        raise ValueError("update_priorities is for a prioritized buffer: create it with priority=<exponent>")

    def state(self) -> dict[str, Any]:
        return {"rng": self.engine.rng.bit_generator.state}

    def restore(self, rng: np.random.Generator) -> None:
        self.engine.rng = rng


SAMPLER = Uniform  # (what sampler="<this module>" opens: shmbuf.samplers.part)
