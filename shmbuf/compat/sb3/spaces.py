"""Gymnasium spaces as JSON, so that a process that attaches to an SB3 buffer by name
knows its spaces (they are recorded in the segment's metadata, never pickled: a segment
must not run code in the processes that read it).

What is kept: the kind of each space, its shape, dtype, ``n`` / ``start`` / ``nvec``, a
Dict's keys, and a Box's bounds when they are one value each (as most are; otherwise
the space read back is unbounded, ``[-inf, inf]``, or its integer dtype's range: the
buffer needs shapes and dtypes, not bounds).

Examples:
    >>> from gymnasium import spaces
    >>> s = spaces.Dict({"pos": spaces.Box(-1, 1, (3,)), "grip": spaces.Discrete(2)})
    >>> space_from_json(space_to_json(s)) == s
    True
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces


def space_to_json(space: spaces.Space) -> dict[str, Any]:
    """``space`` as a JSON object (TypeError for a space SB3's buffers do not store)."""
    if isinstance(space, spaces.Dict):
        return {"kind": "Dict", "spaces": {k: space_to_json(v) for k, v in space.spaces.items()}}
    if isinstance(space, spaces.Box):
        lo, hi = np.unique(space.low), np.unique(space.high)
        bound = (lambda u: u[0].item() if len(u) == 1 and np.isfinite(u[0]) else None)
        return {"kind": "Box", "shape": list(space.shape), "dtype": str(space.dtype),
                "low": bound(lo), "high": bound(hi)}
    if isinstance(space, spaces.Discrete):
        return {"kind": "Discrete", "n": int(space.n), "start": int(space.start), "dtype": str(space.dtype)}
    if isinstance(space, spaces.MultiDiscrete):
        return {"kind": "MultiDiscrete", "nvec": np.asarray(space.nvec).tolist(), "dtype": str(space.dtype)}
    if isinstance(space, spaces.MultiBinary):
        return {"kind": "MultiBinary", "n": list(space.shape)}
    raise TypeError(f"SB3's replay buffers store Box, Discrete, MultiDiscrete, MultiBinary and Dict spaces, "
                    f"got {space!r:.200}")


def space_from_json(doc: dict[str, Any]) -> spaces.Space:
    """The space :func:`space_to_json` recorded."""
    kind = doc["kind"]
    if kind == "Dict":
        return spaces.Dict({k: space_from_json(v) for k, v in doc["spaces"].items()})
    if kind == "Box":
        dtype = np.dtype(doc["dtype"])
        info = np.iinfo(dtype) if dtype.kind in "iu" else None
        low = doc["low"] if doc["low"] is not None else (info.min if info else -np.inf)
        high = doc["high"] if doc["high"] is not None else (info.max if info else np.inf)
        return spaces.Box(low, high, tuple(doc["shape"]), dtype)
    if kind == "Discrete":
        try:
            return spaces.Discrete(doc["n"], start=doc["start"], dtype=doc["dtype"])
        except TypeError:  # gymnasium < 1.1: no dtype= (always int64), which SB3 2.x supports
            return spaces.Discrete(doc["n"], start=doc["start"])
    if kind == "MultiDiscrete":
        try:
            return spaces.MultiDiscrete(doc["nvec"], dtype=doc["dtype"])
        except TypeError:  # (the same, should a gymnasium lack it)
            return spaces.MultiDiscrete(doc["nvec"])
    if kind == "MultiBinary":
        return spaces.MultiBinary(doc["n"])
    raise ValueError(f"not a recorded space: {doc!r:.200}")


def bad_obs(arg: str, value: Any, rows: tuple[int, ...]) -> str:
    """What is wrong with observations ``value`` given as the argument ``arg`` of an
    ``add`` that needs ``rows`` (``(n_envs, *shape)``); "" if their size fits."""
    a = np.asarray(value)
    if a.size == int(np.prod(rows)):
        return ""
    return (f"{arg}: expected {int(np.prod(rows))} values, one observation of shape {rows[1:]} per env "
            f"(n_envs={rows[0]}), got an array of shape {a.shape}")


def bad_shapes(n: int, action_dim: int, action: Any, reward: Any, done: Any) -> str:
    """Which of an ``add``'s ``action``, ``reward``, ``done`` does not hold one entry per env."""
    for arg, value, each in (("action", action, action_dim), ("reward", reward, 1), ("done", done, 1)):
        a = np.asarray(value)
        if a.size != n * each:
            return f"{arg}: expected {n * each} values ({each} per env, n_envs={n}), got an array of shape {a.shape}"
    return "action, reward and done must hold one entry per env"
