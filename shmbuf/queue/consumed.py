"""The sampler of a queue (``mode="queue"``): a queue is consumed with ``take``, never
sampled (see :mod:`shmbuf.queue.protocol`)."""

from __future__ import annotations

from typing import Any

import numpy as np


class Consumed:
    """The sampler of a queue: a queue is consumed with ``take``, never sampled."""


    def __init__(self, engine: Any, outputs: Any) -> None:
        self.engine = engine

    def sample(self, *args: Any) -> Any:
        self.engine.writes.check_sample()  # raises

    update = sample

    def state(self) -> dict[str, Any]:
        return {"rng": self.engine.rng.bit_generator.state}

    def restore(self, rng: np.random.Generator) -> None:
        self.engine.rng = rng
