"""A rollout worker's handle on an episode buffer: one lane per env, steps in order."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from shmbuf.core.deadline import Deadline
from shmbuf.core.layout import LANE_EPISODES, LANE_HEAD
from shmbuf.episodes.rows import FINAL, TERMINATED, TRUNCATED, VERSION, flags_of
from shmbuf.versions.bound import floor
from shmbuf.episodes.parts import Episodes

_BOOL = np.dtype(np.bool_)



class EpisodeWriter:
    """Writes the steps of ``envs`` environments, env ``i`` into lane ``lanes[i]``,
    which this process claims (and so writes without any lock) until :meth:`close`.

    Get one with :meth:`EpisodeBuffer.writer`. Not for several threads at once.
    """

    def __init__(self, buffer: Episodes, envs: int | None, timeout: float | None) -> None:
        if envs is not None and (isinstance(envs, bool) or not isinstance(envs, (int, np.integer)) or envs < 1):
            raise ValueError(f"envs must be an int >= 1 (one lane per env), got {envs!r}")
        self.buffer = buffer
        self.envs = 1 if envs is None else int(envs)
        self._axis = envs is not None  # steps come with an env axis
        core = buffer.core
        ring, t = core.engine.ring, core.engine.seconds(timeout)
        self.lanes: list[int] = ring.claim_many(self.envs, t)
        n = self.envs
        self._lane_array = np.array(self.lanes, np.int64)
        for lane in self.lanes:
            _renumber(ring, lane)
        self._lanes = self._lane_array if self._axis else self.lanes[0]
        self._episode = np.zeros(n, np.int64)  # each env's episode number
        self._start = np.zeros(n, np.int64)  # the lane sequence number of its first step
        self._started = np.zeros(n, bool)  # an episode in progress
        self._sys = {"_episode": self._episode, "_start": self._start, "_flags": np.zeros(n, np.uint8)}
        self._version = np.zeros(n, np.int64)  # versions=True: the version of the rows written now
        self._versioned = core.versioned
        self._v = -1  # the version in self._version (checked against the lanes' newest rows)
        if self._versioned:
            self._sys[VERSION] = self._version
        self._prio = core.prioritized  # a prioritized buffer: steps at the largest
        if self._prio:                         # priority (0), final rows at none (-1)
            self._sys["_priority"] = np.zeros(n)
        if not self._axis:  # the same memory, as one row without a row axis
            self._sys = {k: v.reshape(()) for k, v in self._sys.items()}
        self._n_user = len(buffer.step_rows.user)  # fields of a step as users give them
        self._keys = buffer.step_rows.keys
        self._none = bytes(n)  # tobytes() of n False flags
        self._native = ring.native
        self._names = list(core.engine.layout.stored())  # (the stored fields, in order)
        self._gate = core.engine.gate  # a rate limit: writes wait in _put (no fast path)
        self._in_progress = False  # every env has an episode in progress: add's fast path
        user = buffer.step_rows.user
        self._next_specs = [(o, (n,) + user[o][0], user[o][1]) for o in buffer.observations]
        self._zeros = {k: np.zeros((n,) + shape, dtype) for k, (shape, dtype) in user.items()
                       if k not in buffer.observations}  # a final row's other fields

    # -- writing ---------------------------------------------------------------------

    def add(self, step: Mapping[str, Any], *, terminated: Any, truncated: Any,
            timeout: float | None = None, version: int | None = None) -> None:
        """Add one step of every env: ``{field: value}`` with a leading env axis (none for a
        one-env writer), ``next_<obs>`` at least where an episode ended (the real final
        observation), and ``terminated`` / ``truncated`` flags (arrays of ``envs`` bools).
        ``version``: the policy version of a buffer created with ``versions=True``
        (default: what the buffer's handle is bound to; see :meth:`shmbuf.Buffer.bind`).

        Examples:
            >>> import shmbuf
            >>> buf = shmbuf.EpisodeBuffer.create({"obs": ((2,), "float32"), "reward": ((), "float32")}, 8)
            >>> with buf.writer() as w:
            ...     w.add({"obs": [0, 0], "reward": 1.0}, terminated=False, truncated=False)
            ...     w.add({"obs": [1, 1], "reward": 2.0, "next_obs": [2, 2]}, terminated=True, truncated=False)
            >>> buf.transition_count, buf.num_episodes
            (2, 1)
            >>> buf.close()
        """
        # The common case, checked and written in one native call: every env goes on
        # (no flag set) in an episode it has started, the values are arrays of the
        # fields' dtypes and shapes (put_rows checks those and returns False otherwise).
        # Nothing in the rows changes from step to step but the values given.
        if self._versioned or version is not None:
            self._versions(version)
        if (self._in_progress and type(step) is dict and (len(step) == self._n_user or step.keys() <= self._keys)
                and (timeout is None or type(timeout) is float)):
            if not self._axis:
                if terminated is False and truncated is False \
                        and self._native.put_rows(self._lanes, step, self._sys, timeout) is None:
                    return
            elif (type(terminated) is np.ndarray and type(truncated) is np.ndarray
                  and terminated.dtype is _BOOL and truncated.dtype is _BOOL):  # (inline: this is hot)
                if terminated.tobytes() == self._none == truncated.tobytes():
                    if self._native.put_rows(self._lanes, step, self._sys, timeout) is None:
                        return
                elif terminated.shape == truncated.shape == (self.envs,) and \
                        self._ends(step, terminated, truncated, timeout):
                    return
        self._add(step, terminated, truncated, timeout)

    def _versions(self, version: Any) -> int | None:
        """The version of the rows written now (``version=``, or the bound source's),
        put in the rows' system fields; never below the newest row of our lanes (so a
        write that failed leaves nothing to undo). None without versions."""
        v = self.buffer.core.write_version(version)
        if v is not None and v != self._v:
            engine = self.buffer.engine
            lo, head = engine.window()
            view, lc = engine.view(VERSION), engine.layout.lane_capacity
            for lane in self.lanes:
                if head[lane] > lo[lane]:
                    floor(v, int(view[lane * lc + (head[lane] - 1) % lc]), f"lane {lane}'s newest row is of version")
            self._version[:] = self._v = v
        return v

    def _ends(self, step: dict, term: np.ndarray, trunc: np.ndarray, timeout: float | None) -> bool:
        """``add``'s native path for a step where episodes end: the steps and the final
        rows (:meth:`_step`). False, with nothing written, if anything is off the common
        case (the Python path then checks and explains)."""
        nexts = {}
        for o, shape, dtype in self._next_specs:
            v = step.get("next_" + o)
            if type(v) is not np.ndarray or v.dtype != dtype or v.shape != shape:
                return False
            nexts[o] = v
        if any(type(step.get(k)) is not np.ndarray or step[k].dtype != dtype or step[k].shape != (self.envs,) + shape
               for k, (shape, dtype) in self.buffer.step_rows.user.items()):
            return False
        term = term.view(np.uint8)
        flags = term | (trunc.view(np.uint8) & (term ^ 1)) << 1  # both set: terminated
        self._step({k: step[k] for k in self.buffer.step_rows.user}, {**self._sys, "_flags": flags}, flags,
                   nexts, flags != 0, timeout)
        return True

    def _final_sys(self, e: np.ndarray, flags: np.ndarray) -> dict[str, np.ndarray]:
        """The system fields of the final rows of the envs ``e`` (indices)."""
        sys = {"_episode": self._episode[e], "_start": self._start[e], "_flags": flags[e] | FINAL}
        if self._versioned:
            sys[VERSION] = self._version[e]
        if self._prio:
            sys["_priority"] = np.full(len(e), -1.0)
        return sys

    def _add(self, step: Mapping[str, Any], terminated: Any, truncated: Any, timeout: float | None) -> None:
        """``add`` in full: checks with clear errors, episodes that start and end."""
        n = self.envs if self._axis else None
        term, trunc = flags_of(terminated, truncated, n)
        ended = np.atleast_1d(term | trunc)
        steps, nexts = self.buffer.step_rows.split(step, (n,) if n else (), ended)
        if timeout is not None:
            timeout = self.buffer.engine.seconds(timeout)
        if not self._axis:  # from here on, every value has the env axis
            steps = {k: v[None] for k, v in steps.items()}
            nexts = {k: v[None] for k, v in nexts.items()}
        # checked: nothing raises from here but the writes
        if not self._started.all():
            self._begin(~self._started)
        term, trunc = np.atleast_1d(term), np.atleast_1d(trunc)
        flags = term.view(np.uint8) * TERMINATED | trunc.view(np.uint8) * TRUNCATED
        sys = {"_episode": self._episode, "_start": self._start, "_flags": flags}
        if self._versioned:
            sys[VERSION] = self._version
        if self._prio:
            sys["_priority"] = np.zeros(self.envs)
        self._step(steps, sys, flags, nexts, ended, timeout)
        self._in_progress = bool(self._native is not None and not self._gate.limited and self._started.all())

    def _step(self, steps: dict[str, np.ndarray], sys: dict[str, np.ndarray], flags: np.ndarray,
              nexts: dict[str, np.ndarray], ended: np.ndarray, timeout: float | None) -> None:
        """Write a step of every env (``steps`` and ``sys``: checked, a row per env), then
        the real final observations (``nexts``) of the envs whose episode ``ended``, in
        rows of their own: one write, all or none (:meth:`_put`)."""
        lanes = self._lane_array
        e = np.flatnonzero(ended)
        if len(e):
            final = self._final_sys(e, flags)
            final.update({k: z[:len(e)] for k, z in self._zeros.items()})
            final.update({o: v[e] for o, v in nexts.items()})
            steps = {k: np.concatenate([v, final[k]]) for k, v in {**steps, **sys}.items()}
            sys, lanes = {}, np.concatenate([lanes, lanes[e]])
        self._put(lanes, steps, sys, timeout)
        if len(e):
            self._started[e] = False
            self._begin(ended)  # their next step starts an episode: numbered now (close() takes it back)

    def _begin(self, envs: np.ndarray) -> None:
        """Start an episode in each env of the mask ``envs``: the next number of its
        lane (the lane table keeps the latest) and its head (the lane is ours: nobody
        else moves either)."""
        table = self.buffer.engine.ring.lane_table
        for i in np.flatnonzero(envs).tolist():  # a few at a time: scalars beat fancy indexing
            lane = self.lanes[i]
            self._episode[i] = table[lane, LANE_EPISODES] = table[lane, LANE_EPISODES] + 1
            self._start[i] = table[lane, LANE_HEAD]
            self._started[i] = True

    def _unused(self) -> np.ndarray:
        """The envs whose episode was numbered but has no row yet."""
        heads = self.buffer.engine.ring.lane_table[self._lane_array, LANE_HEAD]
        return self._started & (heads == self._start)

    def _put(self, lanes: np.ndarray, data: dict[str, np.ndarray], sys: dict[str, np.ndarray],
             timeout: float | None) -> None:
        """Row i of ``data`` and ``sys`` (checked arrays, a row per env) into lane
        ``lanes[i]``, all or none (:meth:`shmbuf.core.engine.Engine.write_each`: the rate
        gate once for all rows, then one native call, or one core write per row)."""
        engine = self.buffer.engine
        engine.write_each([data[k] if k in data else sys[k] for k in self._names], lanes, timeout)

    def add_episode(self, episode: Mapping[str, Any], *, terminated: bool = True,
                    env: int = 0, timeout: float | None = None, version: int | None = None) -> None:
        """Write a whole episode of ``T`` steps into env ``env``'s lane in one reservation
        (garage's ``add_path``, d3rlpy's ``append_episode``). ``next_<obs>`` is either the
        ``T`` next observations or just the final one; ``terminated=False`` means the
        episode was cut (truncated). Raises ValueError while that env has an episode in
        progress, or if ``T + 1`` rows (the steps and the final observation) do not fit
        in a lane. ``version``: as :meth:`add`'s."""
        if not isinstance(terminated, (bool, np.bool_)):
            raise TypeError(f"terminated must be a bool, got {terminated!r}")
        if isinstance(env, bool) or not isinstance(env, (int, np.integer)) or not 0 <= env < self.envs:
            raise ValueError(f"env must be an int in [0, {self.envs}), got {env!r}")
        steps = int(self.buffer.engine.ring.lane_table[self.lanes[env], LANE_HEAD] - self._start[env])
        if self._started[env] and steps:
            raise ValueError(f"env {env} has an episode in progress ({steps} steps); finish it "
                             "with add(..., terminated=/truncated=) before add_episode")
        rows = self.buffer.step_rows
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
        v = self._versions(version)
        # checked: the steps and the final row, in one reservation
        this = np.arange(self.envs) == env
        if not self._started[env]:
            self._begin(this)
        flags = TERMINATED if terminated else TRUNCATED
        last = {k: np.zeros((1,) + v.shape[1:], v.dtype) for k, v in steps.items()}
        last.update(final)
        data = {k: np.concatenate([v, last[k]]) for k, v in steps.items()}
        data["_episode"] = np.full(length + 1, self._episode[env])
        data["_start"] = np.full(length + 1, self._start[env])
        data["_flags"] = np.zeros(length + 1, np.uint8)
        data["_flags"][-2:] = flags, FINAL | flags
        if v is not None:
            data[VERSION] = np.full(length + 1, v, np.int64)
        if self._prio:
            data["_priority"] = np.zeros(length + 1)
            data["_priority"][-1] = -1.0  # the final row: never drawn
        try:
            self.buffer.core.engine.extend(data, self.lanes[env], timeout)
        except BaseException:
            self._started[env] = False
            self._in_progress = False
            raise
        self._started[env] = False
        self._begin(this)  # the env's next episode, numbered now as add() does

    # -- lifetime ----------------------------------------------------------------------

    def close(self, timeout: float | None = None) -> None:
        """Release the lanes, all within ``timeout`` (one deadline; a lane not released in
        time stays this writer's, for the next close). An episode in progress stays
        unfinished: its rows are transitions where the next observation is known, never
        a whole episode."""
        ring, deadline = self.buffer.engine.ring, Deadline(self.buffer.engine.seconds(timeout))
        if self.lanes and len(self.lanes) == self.envs:  # numbers not used: given back
            unused = self._unused()
            ring.lane_table[self._lane_array[unused], LANE_EPISODES] -= 1
            self._started[:] = False
        while self.lanes:
            ring.release(self.lanes[-1], deadline.left())
            self.lanes.pop()

    def __enter__(self) -> "EpisodeWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _renumber(ring: Any, lane: int) -> None:
    """Make the lane's episode count the number of its newest published row: a writer
    killed after numbering an episode it wrote nothing of leaves the count one ahead,
    which would show as an episode that is not there."""
    lo, head = ring.window_lists()
    if head[lane] > lo[lane]:
        slot = lane * ring.lane_capacity + (head[lane] - 1) % ring.lane_capacity
        if ring.stamps[slot] == 2 * (head[lane] - 1) + 2:
            ring.lane_table[lane, LANE_EPISODES] = ring.arrays["_episode"][slot]
