"""A rollout worker's handle on an episode buffer: one lane per env, steps in order."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

from ..layout import LANE_EPISODES
from .rows import FINAL, TERMINATED, TRUNCATED, flags_of

if TYPE_CHECKING:
    from .buffer import EpisodeBuffer


class EpisodeWriter:
    """Writes the steps of ``envs`` environments, env ``i`` into lane ``lanes[i]``,
    which this process claims (and so writes without any lock) until :meth:`close`.

    Get one with :meth:`EpisodeBuffer.writer`. Not for several threads at once.
    """

    def __init__(self, buffer: "EpisodeBuffer", envs: int | None, timeout: float | None) -> None:
        if envs is not None and (isinstance(envs, bool) or not isinstance(envs, (int, np.integer)) or envs < 1):
            raise ValueError(f"envs must be an int >= 1 (one lane per env), got {envs!r}")
        self.buffer = buffer
        self.envs = 1 if envs is None else int(envs)
        self._axis = envs is not None and envs > 1  # steps come with an env axis
        core = buffer.core
        ring, t = core._ring, core._t(timeout)
        self.lanes: list[int] = []
        try:
            for _ in range(self.envs):
                self.lanes.append(ring.claim(None, t))
        except BaseException:
            self.close()
            raise
        self._step = np.zeros(self.envs, np.int64)  # index of each env's next step
        self._episode = np.zeros(self.envs, np.int64)

    # -- writing ---------------------------------------------------------------------

    def add(self, step: Mapping[str, Any], *, terminated: Any, truncated: Any,
            timeout: float | None = None) -> None:
        """Add one step of every env: ``{field: value}`` with a leading env axis (none for a
        one-env writer), ``next_<obs>`` at least where an episode ended (the real final
        observation), and ``terminated`` / ``truncated`` flags (arrays of ``envs`` bools).

        Example:
            >>> import shmbuf
            >>> buf = shmbuf.EpisodeBuffer.create({"obs": ((2,), "float32"), "reward": ((), "float32")}, 8)
            >>> with buf.writer() as w:
            ...     w.add({"obs": [0, 0], "reward": 1.0}, terminated=False, truncated=False)
            ...     w.add({"obs": [1, 1], "reward": 2.0, "next_obs": [2, 2]}, terminated=True, truncated=False)
            >>> buf.transition_count, buf.num_episodes
            (2, 1)
            >>> buf.close()
        """
        n = self.envs if self._axis else None
        term, trunc = flags_of(terminated, truncated, n)
        ended = term | trunc
        steps, nexts = self.buffer._rows.split(step, (n,) if n else (), ended)
        if not self._axis:
            steps = {k: v[None] for k, v in steps.items()}
            nexts = {k: v[None] for k, v in nexts.items()}
            term, trunc, ended = term[None], trunc[None], ended[None]
        for i in range(self.envs):  # checked above: nothing raises from here but the writes
            rows = {k: v[i:i + 1] for k, v in steps.items()}
            flags = TERMINATED * int(term[i]) + TRUNCATED * int(trunc[i])
            final = {o: v[i:i + 1] for o, v in nexts.items()} if ended[i] else None
            self._write(i, rows, 1, flags, final, timeout)

    def add_episode(self, episode: Mapping[str, Any], *, terminated: bool = True,
                    env: int = 0, timeout: float | None = None) -> None:
        """Write a whole episode of ``T`` steps into env ``env``'s lane in one reservation
        (garage's ``add_path``, d3rlpy's ``append_episode``). ``next_<obs>`` is either the
        ``T`` next observations or just the final one; ``terminated=False`` means the
        episode was cut (truncated). Raises ValueError while that env has an episode in
        progress, or if ``T + 1`` rows (the steps and the final observation) do not fit
        in a lane."""
        if not isinstance(terminated, (bool, np.bool_)):
            raise TypeError(f"terminated must be a bool, got {terminated!r}")
        if self._step[env] != 0:
            raise ValueError(f"env {env} has an episode in progress ({self._step[env]} steps); finish it "
                             "with add(..., terminated=/truncated=) before add_episode")
        rows = self.buffer._rows
        if not isinstance(episode, Mapping):
            raise TypeError(f"an episode is a mapping of field names to arrays, got {type(episode).__name__}")
        length = min((len(np.asarray(v)) if np.ndim(v) else 0 for k, v in episode.items() if k in rows.user),
                     default=0)  # a mismatch between fields is reported by split() below
        if length < 1:
            raise ValueError("an episode needs at least one step (fields with a leading axis of T steps)")
        if length + 1 > self.buffer.lane_capacity:
            raise ValueError(f"an episode of {length} steps needs {length + 1} rows (the steps and the final "
                             f"observation), more than a lane holds ({self.buffer.lane_capacity})")
        given = dict(episode)
        steps, _ = rows.split({k: v for k, v in given.items() if not k.startswith("next_")},
                              (length,), np.zeros(0, bool))
        final = {}
        for o in rows.observations:  # the T next observations (keep the last), or the final one
            if "next_" + o not in given:
                raise ValueError(f"next_{o} missing: an episode needs its final observation")
            v = given["next_" + o]
            if np.ndim(v) == len(rows.user[o][0]) + 1:
                if len(v) != length:
                    raise ValueError(f"next_{o}: expected {length} rows or one observation, got {len(v)} rows")
                v = np.asarray(v)[-1]
            final[o] = rows.array("next_" + o, v, (), o)[None]
        flags = TERMINATED if terminated else TRUNCATED
        self._write(env, steps, length, flags, final, timeout)

    def _write(self, env: int, steps: dict[str, np.ndarray], n: int, flags: int,
               final: dict[str, np.ndarray] | None, timeout: float | None) -> None:
        """Write ``n`` steps of env ``env`` (the last with ``flags``), then the final row."""
        core, lane = self.buffer.core, self.lanes[env]
        if self._step[env] == 0:  # a new episode: the next number of the lane (we own it)
            table = core._ring.lane_table
            table[lane, LANE_EPISODES] += 1
            self._episode[env] = table[lane, LANE_EPISODES]
        t0 = int(self._step[env])
        rows = dict(steps)
        rows["_episode"] = np.full(n, self._episode[env])
        rows["_step"] = np.arange(t0, t0 + n, dtype=np.int32)
        rows["_flags"] = np.zeros(n, np.uint8)
        rows["_flags"][-1] = flags
        if final is not None:
            last = {k: np.zeros((1,) + v.shape[1:], v.dtype) for k, v in steps.items()}
            last.update(final)
            last["_episode"] = rows["_episode"][:1]
            last["_step"] = np.array([t0 + n], np.int32)
            last["_flags"] = np.array([FINAL | flags], np.uint8)
            rows = {k: np.concatenate([v, last[k]]) for k, v in rows.items()}
        core.extend(rows, lane=lane, timeout=timeout)
        self._step[env] = 0 if final is not None else t0 + n

    # -- lifetime ----------------------------------------------------------------------

    def close(self, timeout: float | None = None) -> None:
        """Release the lanes. An episode in progress stays unfinished: its rows are
        transitions where the next observation is known, never a whole episode."""
        ring, t = self.buffer.core._ring, self.buffer.core._t(timeout)
        while self.lanes:
            ring.release(self.lanes.pop(), t)

    def __enter__(self) -> "EpisodeWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
