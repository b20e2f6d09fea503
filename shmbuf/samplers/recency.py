"""Recency-weighted sampling: rows drawn with replacement, each with probability
proportional to ``exp(-age / tau)``, where ``age`` counts rows of its own lane (0: that
lane's newest row, 1: the one before, ...). Chosen with
``Buffer.create(..., sampler=("recency", {"tau": TAU}))``; ``tau`` (a float > 0, in rows,
required) is the age at which a row's weight has fallen to ``1/e`` of the newest's:
about ``tau`` rows of each lane carry most of the mass, rows much older than a few
``tau`` are seldom drawn.

A draw takes one look at the lanes: a lane's mass is the sum of its rows' weights, a
geometric series (``(1 - q**size) / (1 - q)``, ``q = exp(-1/tau)``), so the lane is drawn
by mass and the row's age by the inverse of the truncated geometric distribution's CDF:
two uniform numbers a row, no loop over the rows held. The rows drawn are then read
through the checked gather: a row being written, reserved by a writer that died, or
overwritten while copied is drawn again (after five rounds, from the exact set of
published rows, by the same weights: a buffer mostly reserved by writers that died is
still sampled as it should be). Never torn, never unpublished.

The batch carries ``weight``: each row's importance weight ``(P_min / P_i) ** beta``,
``P_i`` the probability with which it was drawn and ``P_min`` the smallest probability
of a row held (the oldest row of the largest lane), so weights are <= 1 and the row held
least likely to be drawn has weight 1 (with ``beta=1``, the default, the mean of
``weight * f(row)`` is in expectation a uniform sample's mean of ``f``, times ``P_min``
times the rows held). ``beta`` is ``sample``'s ``beta=``: a float in [0, 1] (0: all
weights 1). Lanes much longer than ``tau`` make the newest rows' weights tiny
(``exp(-beta * (size - 1) / tau)``, 0 in float64 once that exponent passes about 745):
pick ``tau`` and ``beta`` for the sizes the lanes reach. ``out=`` is refused (the batch
gains ``weight``, which no ``empty_batch`` holds).

``ValueError`` if the buffer holds no rows, or holds some but none is published and no
live writer is writing one; while live writers hold every row, the sample waits for them
up to its timeout, then raises ``SampleTimeout`` saying so.

Examples:
    >>> import numpy as np, shmbuf
    >>> buf = shmbuf.Buffer.create({"x": ((), "int64")}, 1000, sampler=("recency", {"tau": 50.0}), seed=0)
    >>> buf.extend({"x": np.arange(1000)})
    >>> b = buf.sample(10_000)
    >>> bool(b["x"].mean() > 900), bool(b["weight"].max() <= 1.0)  # mostly recent rows
    (True, True)
    >>> buf.close()
"""

from __future__ import annotations

import math
import numbers
import time
from typing import Any, Mapping

import numpy as np

from shmbuf.core import pool
from shmbuf.core.batch import Outputs
from shmbuf.core.engine import Engine
from shmbuf.core.read import Sampler
from shmbuf.samplers.uniform import Uniform

EXACT_AFTER = 4  # rounds 0 .. 4 draw by the weights of every row held; later ones, of the published rows only


class Recency(Uniform):
    """Rows drawn with probability proportional to ``exp(-age / tau)``, with
    ``weight`` (see the module)."""


    @classmethod
    def options(cls, given: Mapping[str, Any]) -> dict[str, Any]:
        """``{"tau": float}``: ``tau`` a finite number > 0 (rows), required; no other key.

        Examples:
            >>> Recency.options({"tau": 100})
            {'tau': 100.0}
        """
        if not isinstance(given, Mapping):
            raise TypeError(f"the options of sampler 'recency' must be a mapping such as {{'tau': 100.0}}, got {given!r}")
        unknown = sorted(str(k) for k in given if k != "tau")
        if unknown:
            raise ValueError(f"sampler 'recency' takes the option 'tau' only, got {unknown}")
        if "tau" not in given:
            raise ValueError("sampler 'recency' needs the option 'tau' (rows: a row's weight is exp(-age / tau)), "
                             "e.g. sampler=(\"recency\", {\"tau\": 1000.0}); got none")
        tau = given["tau"]
        if isinstance(tau, (bool, np.bool_)) or not isinstance(tau, numbers.Real):
            raise TypeError(f"option 'tau' of sampler 'recency' must be a number of rows > 0, got {tau!r}")
        if not (math.isfinite(tau) and tau > 0):
            raise ValueError(f"option 'tau' of sampler 'recency' must be a finite number of rows > 0, got {tau!r}")
        return {"tau": float(tau)}

    def __init__(self, engine: Engine, outputs: Outputs, *, tau: float) -> None:
        super().__init__(engine, outputs)
        self.tau = self.options({"tau": tau})["tau"]

    def sample(self, n: int, out: Any, timeout: float | None, beta: Any) -> dict[str, np.ndarray]:
        if out is not None:
            raise ValueError("out= is not supported by the recency sampler (the batch gains a weight); "
                             "call sample() without it")
        beta = check_beta(beta)
        rows = Rows(self.engine, self.outputs.names, self.tau)
        got = self.engine.read(rows, n, n, timeout)
        logp = got.pop("_logp")
        got["weight"] = np.exp(beta * (rows.low - logp))
        return got


def check_beta(beta: Any) -> float:
    """``beta=`` of a recency sample: a float in [0, 1] (None: 1.0)."""
    if beta is None:
        return 1.0
    if isinstance(beta, (bool, np.bool_)) or not isinstance(beta, numbers.Real):
        raise TypeError(f"beta= is the exponent of the importance weights (P_min / P) ** beta: a float in [0, 1], "
                        f"got {beta!r}")
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta= is the exponent of the importance weights (P_min / P) ** beta: a float in [0, 1], "
                         f"got {beta!r}")
    return float(beta)


def masses(sizes: np.ndarray, tau: float) -> np.ndarray:
    """Each lane's mass ``sum(exp(-age / tau) for age < size)``, times ``1 - exp(-1/tau)``
    (the factor all lanes share): ``1 - exp(-size / tau)``."""
    return -np.expm1(-np.asarray(sizes, np.float64) / tau)


def draw_ages(rng: np.random.Generator, n: int, sizes: np.ndarray, tau: float) -> tuple[np.ndarray, np.ndarray]:
    """``n`` rows drawn with probability proportional to ``exp(-age / tau)`` over lanes of
    ``sizes`` rows (a total above 0): their lanes and ages. The lane by its mass, the
    age by the inverse CDF of the geometric distribution truncated to the lane's size:
    ``P(age <= a) = (1 - q**(a+1)) / (1 - q**size)``, so ``age = floor(-tau * log(1 - v
    * (1 - q**size)))`` for a uniform ``v``.

    Examples:
        >>> lanes, ages = draw_ages(np.random.default_rng(0), 5, np.array([3, 0, 2]), 1.0)
        >>> bool(set(lanes.tolist()) <= {0, 2}), bool((ages < np.array([3, 0, 2])[lanes]).all())
        (True, True)
    """
    sizes = np.asarray(sizes, np.int64)
    mass = masses(sizes, tau)
    u = rng.random((2, n))
    if len(sizes) == 1:
        lanes = np.zeros(n, np.int64)
    else:
        cum = np.cumsum(mass)
        lanes = np.minimum(cum.searchsorted(u[0] * cum[-1], side="right"), np.flatnonzero(sizes)[-1])
    ages = np.floor(-tau * np.log1p(-u[1] * mass[lanes])).astype(np.int64)
    return lanes, np.minimum(ages, sizes[lanes] - 1)  # (rounding at the top of the range)


class Rows(Sampler):
    """Rows drawn by recency for :func:`~shmbuf.core.read.read`, each with the log of its
    probability at its draw (the private ``_logp``); ``low`` is the log of the smallest
    probability of a row held in any look a draw took (every weight is then <= 1)."""

    what = "rows drawn by recency"

    def __init__(self, engine: Engine, names: list[str], tau: float) -> None:
        self.engine, self.names, self.tau = engine, names, tau
        self.fields = {f.name: f for f in engine.fields}
        self.low, self.delay = np.inf, 0.0

    def empty(self, m: int) -> dict[str, np.ndarray]:
        return pool.batch([self.fields[name] for name in self.names], m, _logp=float)

    def draw(self, todo: np.ndarray, rounds: int, deadline: float) -> Any:
        m, tau = len(todo), self.tau
        lo, head = self.engine.window()
        sizes = head - lo
        if not sizes.any():
            raise ValueError("cannot sample from an empty buffer: add rows first")
        log_total = math.log(float(masses(sizes, tau).sum())) - math.log(-math.expm1(-1.0 / tau))
        self.low = min(self.low, -(int(sizes.max()) - 1) / tau - log_total)
        if rounds <= EXACT_AFTER:
            lanes, ages = draw_ages(self.engine.rng, m, sizes, tau)
        else:
            got = self.published(lo, head, m)
            if got is None:
                return None
            lanes, ages = got
        return lanes, head[lanes] - 1 - ages, -ages / tau - log_total

    def published(self, lo: np.ndarray, head: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray] | None:
        """``m`` rows of the look ``lo, head`` drawn by the same weights from the published
        ones only (their lanes and ages); None if there are none yet (live writers are
        writing them, or rows came meanwhile); ``ValueError`` if there never will be."""
        sizes = head - lo
        live = self.engine.writing()
        lane = np.repeat(np.arange(len(sizes)), sizes)
        age = np.arange(len(lane)) - np.repeat(np.cumsum(sizes) - sizes, sizes)
        ok = self.engine.published(lane, head[lane] - 1 - age)
        if ok.any():
            lane, age = lane[ok], age[ok]
            cum = np.cumsum(np.exp(-(age - age.min()) / self.tau))
            pick = np.minimum(cum.searchsorted(self.engine.rng.random(m) * cum[-1], side="right"), len(cum) - 1)
            return lane[pick], age[pick]
        if not live:
            now = self.engine.window()
            if np.array_equal(now[0], lo) and np.array_equal(now[1], head):
                raise ValueError(f"cannot sample: none of the {len(lane)} rows the buffer holds is published, and no "
                                 "live writer is writing one (rows reserved by writers that died or gave up never "
                                 "come); add rows")
            return None  # (rows came meanwhile: look again)
        self.hint = (f": none of the {len(lane)} rows the buffer holds is published; live writers are still writing "
                     "them (the sample waited for them)")
        time.sleep(self.delay)
        self.delay = min(max(self.delay * 2, 50e-6), 2e-3)
        return None

    def gather(self, drawn: Any, out: dict[str, np.ndarray]) -> np.ndarray | None:
        m = len(out["_logp"])
        if drawn is None:
            return np.zeros(m, bool)
        lanes, seqs, logp = drawn
        out["_logp"][:] = logp
        return self.engine.gather(lanes, seqs, 1, [out[name] for name in self.names])


SAMPLER = Recency  # (what sampler="<this module>" opens: shmbuf.samplers.part)
