"""A rate limit as a part (``Buffer.create(..., rate=shmbuf.RateLimit(...))``; see
:mod:`shmbuf.parts` and :mod:`shmbuf.rate.limit`): every handle's samples and inserts keep
to a ratio, across all processes."""

from __future__ import annotations

from typing import Any

from shmbuf.rate.limit import Limiter, RateLimit

KEY = KEYWORD = "rate"
EXCLUDES: dict[str, str] = {}


def spec(rate: Any) -> dict | None:
    if rate is None:
        return None
    if not isinstance(rate, RateLimit):
        raise TypeError(f"rate must be a shmbuf.RateLimit, got {type(rate).__name__}")
    return rate.to_meta()


def keyword(spec_: dict | None) -> RateLimit | None:
    return None if spec_ is None else RateLimit.from_meta(spec_)


def plan(spec_: dict, p: Any) -> None:
    """(Nothing in the segment of its own: its counts are the ring's.)"""


def open(spec_: dict, engine: Any) -> dict[str, Any]:
    return {"gate": Limiter(RateLimit.from_meta(spec_), engine.ring)}
