"""What an episode buffer stores in each row, and how steps become rows.

Row ``t`` of an episode holds the step's own values (``obs_t``, ``action_t``,
``reward_t``, ...) and three system fields, all but the flags the same for every row
of the episode (so a writer updates nothing per step):

* ``_episode``: the episode's number in its lane (the lane table counts them);
* ``_start``: the lane sequence number of the episode's first step, so row ``s`` is
  step ``s - _start``;
* ``_flags``: ``TERMINATED`` / ``TRUNCATED`` on the episode's last step, ``FINAL`` on
  the extra row written after it.

Observations are stored once: ``next_obs_t`` is ``obs`` of the lane's next row when the
episode goes on. When it ends, the real final observation goes into one extra row
(``FINAL``: its observation fields hold it, its other fields zeros), written right
after the last step (``add_episode``: in the same reservation), so it takes one of
the ``capacity`` rows per episode and is never a transition itself.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from shmbuf.core import validate
from shmbuf.core.layout import normalize_fields

TERMINATED, TRUNCATED, FINAL = 1, 2, 4
SYSTEM = {"_episode": ((), np.int64), "_start": ((), np.int64), "_flags": ((), np.uint8)}
VERSION = "version"  # (versions=True: written by the writer like the system fields, returned like a user's)


def plan(fields: Mapping[str, Any], observations: Sequence[str] | None,
         reward: str | None) -> tuple[dict[str, Any], list[str]]:
    """The core buffer's fields (the user's plus the system fields) and the names of
    the observation fields. ``observations`` defaults to ``["obs"]``."""
    specs = {f.name: (f.shape, f.dtype) for f in normalize_fields(fields)}
    clash = sorted(k for k in specs if k.startswith("_") or k.startswith("next_"))
    if clash:
        raise ValueError(f"field names {clash} are reserved: fields starting with '_' hold the episode "
                         "index and next_<obs> is derived from the next row; rename them")
    if observations is None:
        observations = ["obs"] if "obs" in specs else []
    if isinstance(observations, str) or not all(isinstance(o, str) for o in observations):
        raise TypeError(f"observations must be a list of field names, got {observations!r}")
    observations = list(observations)
    missing = [o for o in observations if o not in specs]
    if not observations or missing or len(set(observations)) != len(observations):
        raise ValueError(
            f"observations must name fields of the buffer, each once (got {observations!r}, "
            f"fields {list(specs)}); pass observations=[...] to say which fields are observations "
            "(the default is ['obs'])")
    if reward is not None and (reward not in specs or specs[reward][0] != ()
                               or specs[reward][1].kind not in "iuf"):
        raise ValueError(f"reward={reward!r} must name a scalar number field of the buffer (fields "
                         f"{list(specs)}); pass reward=None for a buffer without rewards")
    return {**specs, **SYSTEM}, observations


class StepRows:
    """Turns ``add`` / ``add_episode`` input into the rows of one lane, checked first."""

    def __init__(self, fields: Mapping[str, tuple[tuple[int, ...], np.dtype]], observations: list[str]) -> None:
        self.user = {k: v for k, v in fields.items() if k not in SYSTEM}
        self.observations = observations
        self.keys = set(self.user) | {"next_" + o for o in observations}
        self.schema = validate.Schema(normalize_fields(self.user))
        self._field = {f.name: f for f in self.schema.fields}

    def split(self, data: Mapping[str, Any], lead: tuple[int, ...],
              ended: np.ndarray) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """``data`` checked against ``lead`` leading axes: (the step fields, the next
        observations). ``next_<obs>`` is required where ``ended`` is set, ignored elsewhere."""
        if not isinstance(data, Mapping):
            raise TypeError(f"expected a mapping of field names to values, got {type(data).__name__}")
        given = set(data)
        missing_next = sorted(k for k in self.keys - given if k.startswith("next_"))
        if given - self.keys or (set(self.user) - given):
            validate.check_keys(self.schema.fields, {k: v for k, v in data.items() if not k.startswith("next_")},
                                "a step")
            raise ValueError(f"unexpected field(s) {sorted(given - self.keys)}; the buffer stores "
                             f"{sorted(self.user)} and takes next_<obs> for {self.observations}")
        if missing_next and ended.any():
            raise ValueError(f"{missing_next} missing: an episode ended (terminated or truncated), so its "
                             "real final observation is needed")
        steps = {k: self.array(k, data[k], lead) for k in self.user}
        nexts = {o: self.array("next_" + o, data["next_" + o], lead, o)
                 for o in self.observations if "next_" + o in given}
        return steps, nexts

    def array(self, key: str, value: Any, lead: tuple[int, ...], field: str | None = None) -> np.ndarray:
        shape, dtype = self.user[field or key]
        a = value if type(value) is np.ndarray else np.asarray(value)
        if a.shape != lead + shape:
            what = "one step" if not lead else f"{lead[0]} rows along axis 0"
            raise ValueError(f"field {key!r}: expected shape {lead + shape} ({what}), got {a.shape}")
        if a.dtype != dtype:  # cast as the core casts: refused where a value would not survive
            validate.check_cast(self._field[field or key], a)
            a = a.astype(dtype)
        return a


def flags_of(terminated: Any, truncated: Any, n: int | None) -> tuple[np.ndarray, np.ndarray]:
    """``(terminated, truncated)`` as bool arrays of ``n`` (or 0-d for None), checked."""
    out = []
    for name, v in (("terminated", terminated), ("truncated", truncated)):
        a = np.asarray(v)
        if a.dtype != np.bool_:
            raise TypeError(f"{name} must be bool (or an array of bools), got {a.dtype} {v!r:.80}")
        want = () if n is None else (n,)
        if a.shape != want:
            raise ValueError(f"{name}: expected shape {want} (one flag per env), got {a.shape}")
        out.append(a)
    return out[0], out[1] & ~out[0]  # both set counts as terminated (gymnasium's rule)
