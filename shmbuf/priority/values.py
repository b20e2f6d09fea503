"""The numbers of prioritized replay, checked: the exponents ``a`` (``priority=``) and ``b``
(``beta=``), and priorities, whose ``p**a`` must fit the trees (:func:`largest_leaf`)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

DEFAULT_BETA = 0.4  # cpprb's default
LARGEST = float(np.finfo(np.float64).max)


def leaves(capacity: int) -> int:
    """P: the number of leaves, the power of two >= capacity."""
    return 1 << max(capacity - 1, 0).bit_length()


def _exponent(value: Any, what: str) -> float:
    """``value`` as a float if it is a finite number >= 0, else ValueError naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or not math.isfinite(value) or value < 0:
        raise ValueError(f"{what}, got {value!r}")
    return float(value)


def check_alpha(alpha: Any) -> float:
    """The priority exponent ``a`` (``priority=``), checked."""
    return _exponent(alpha, "priority= is the exponent a of p**a: a finite number >= 0 (0.6 is usual, "
                            "0 samples uniformly)")


def check_beta(beta: Any) -> float:
    """The importance-weight exponent ``b`` (``beta=``; None: :data:`DEFAULT_BETA`), checked."""
    if beta is None:
        return DEFAULT_BETA
    return _exponent(beta, "beta= is the exponent b of the importance weights (N * P(i))**-b: a finite "
                           "number >= 0 (0.4 is usual, annealed to 1 over training)")


def largest_leaf(capacity: int) -> float:
    """The largest ``p**a`` a leaf may hold in a buffer of ``capacity`` rows: the largest
    float64 over the number of leaves, so that the sum of them all (the root of the sum
    tree, which every draw scales by) stays finite. ``largest_leaf(1000)``: 1.8e308 / 1024."""
    return LARGEST / leaves(capacity)


def check_values(priorities: Any, n: int | None, what: str, alpha: float | None = None,
                 capacity: int | None = None) -> np.ndarray:
    """``priorities`` as float64 ``(n,)``; ValueError unless all are finite and > 0 and
    (given ``alpha`` and ``capacity``) each ``p**alpha`` is in ``(0, largest_leaf(capacity)]``:
    a larger one would make the trees' sum infinite, a 0 a row that is never drawn.

    Examples:
        >>> check_values([1e308], 1, "update_priorities", 1.0, 8)
        Traceback (most recent call last):
        ...
        ValueError: update_priorities: p**a must be at most 2.24712e+307 in a buffer of 8 rows ...
    """
    p = np.asarray(priorities, dtype=np.float64)
    if n is not None:
        if p.size != n:
            raise ValueError(f"{what}: expected {n} priorities (one per row), got shape {p.shape}")
        p = p.reshape(n)
    if p.size and not (p.min() > 0 and p.max() < math.inf):  # (a NaN makes the minimum NaN)
        bad = ~((p > 0) & (p < math.inf))
        raise ValueError(f"{what}: priorities must be finite and > 0, got {p[bad][:5].tolist()} "
                         "(with TD errors, pass abs(td) + a small epsilon such as 1e-6)")
    if alpha is None or capacity is None or not p.size:
        return p
    with np.errstate(over="ignore", under="ignore"):
        leaf = p ** alpha
    top = largest_leaf(capacity)
    if leaf.max() > top:
        bad = p[leaf > top][:5].tolist()
        most = math.exp(math.log(top) / alpha)  # (alpha > 0 here: p**0 is 1)
        raise ValueError(f"{what}: p**a must be at most {top:g} in a buffer of {capacity} rows (the largest "
                         f"float64 over its {leaves(capacity)} leaves, so that the sum over the whole buffer stays "
                         f"finite), got priorities {bad} with a = {alpha:g}: pass priorities <= {most:g} "
                         "(clip them, or scale them all down)")
    if leaf.min() == 0:
        bad = p[leaf == 0][:5].tolist()
        raise ValueError(f"{what}: priorities {bad} give p**a = 0 with a = {alpha:g} (below the smallest float64): "
                         "such a row could never be drawn; pass larger priorities (with TD errors, abs(td) + a "
                         "small epsilon such as 1e-6)")
    return p
