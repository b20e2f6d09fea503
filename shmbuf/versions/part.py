"""Policy versions as a part (``Buffer.create(..., versions=True)``; see
:mod:`shmbuf.parts` and :mod:`shmbuf.versions.bound`): every row keeps the version of
the policy that made it."""

from __future__ import annotations

from typing import Any

import numpy as np

from shmbuf.versions.bound import Versions
from shmbuf.versions.recent import FIELD

KEY = KEYWORD = "versions"
EXCLUDES: dict[str, str] = {}


def spec(versions: Any) -> dict | None:
    if not isinstance(versions, bool):
        raise TypeError(f"versions must be True or False, got {versions!r}")
    return {} if versions else None


def keyword(spec_: dict | None) -> bool:
    return spec_ is not None


def plan(spec_: dict, p: Any) -> None:
    p.add_field(FIELD, (), np.int64, "a buffer created with versions=True keeps each row's policy version there")


def open(spec_: dict, engine: Any) -> dict[str, Any]:
    return {"versions": Versions()}
