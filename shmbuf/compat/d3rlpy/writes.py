"""The writing half of the d3rlpy facade's ``ReplayBuffer``: steps and episodes into
shared memory, the episode in progress kept in the process as d3rlpy keeps it, and a
FIFO's eviction (behaviour of d3rlpy 2.8.1)."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from shmbuf.compat.d3rlpy import episodes as d3rlpy_episodes


class Appends:
    """Mixin of :class:`shmbuf.compat.d3rlpy.ReplayBuffer`: ``append``,
    ``clip_episode``, ``append_episode``.

    The steps of the episode in progress are kept here (``_active``) and written to the
    handle's lane two steps behind (``_written`` of them so far), so that the step
    flagged as the episode's end is known when it is written. ``_rows`` are the lane
    rows of this handle's steps (each a transition once the next row is written), the
    ``_active_rows`` newest of them the active episode's; a FIFO trims the lane to the
    newest ``_limit`` transitions, counting the active episode's.
    """

    _ebuf: Any
    _active: Any
    _written: int
    _start: Optional[int]
    _active_rows: int
    _limit: Optional[int]
    _rows: Any
    _stored: int
    _cut: Optional[int] = None  # a FIFO's oldest row drawn in this lane (rows before it: evicted)
    _cut_start: Optional[int] = None  # the first row of its episode (the ring's base)

    def _below(self) -> int:
        """Step rows of this lane still in the ring but before ``_cut`` (evicted)."""
        if self._cut is None:
            return 0
        lo = int(self._ebuf.engine.ring.window()[0][self._lane()])
        return max(self._cut - max(int(self._cut_start), lo), 0)  # type: ignore[arg-type]

    # -- writing -----------------------------------------------------------------------------

    def _step(self, observation: Any, action: Any, reward: Any) -> dict[str, np.ndarray]:
        if self._preprocessor is not None:
            observation = self._preprocessor.process_observation(observation)
            action = self._preprocessor.process_action(action)
            reward = self._preprocessor.process_reward(reward)
        fields = self._ebuf.fields
        obs = list(observation) if self._tuple else [observation]
        if len(obs) != len(self._obs):
            raise ValueError(f"expected {len(self._obs)} observation arrays, got {len(obs)}")
        step = {o: np.array(v, fields[o][1]).reshape(fields[o][0]) for o, v in zip(self._obs, obs)}
        step["action"] = np.array(action).reshape(fields["action"][0])
        step["reward"] = np.array(reward, np.float64).reshape(())
        return step

    def append(self, observation: Any, action: Any, reward: Any) -> None:
        """Append one step to the active episode: the step before it becomes a
        transition (sampled here at once; by other processes once two more steps or
        :meth:`clip_episode` follow)."""
        step = self._step(observation, action, reward)
        write = not self._write_at_termination and self._active.n + 1 - self._written > 2
        self._room(int(self._active.n > 0), int(write))  # (refused: nothing changed)
        if write:
            self._lane()  # (claimed before anything changes)
        self._active.append(step)
        if write:
            self._write(self._written, self._written + 1, None)
        self._trim()

    def clip_episode(self, terminated: bool) -> None:
        """End the active episode: ``terminated=True`` makes its last step a terminal
        transition (next observation zeros); ``False`` (a time limit) keeps its last
        observation as the next observation of the step before, not a transition. An
        episode of one step is not ended (d3rlpy's behaviour: the step stays, and the
        next appends go on from it)."""
        active = self._active
        if active.transition_count == 0:
            return
        end = active.n if terminated else active.n - 1
        self._room(int(bool(terminated)), end - self._written + 1)
        self._write(self._written, end, bool(terminated))
        active.clear()
        self._written, self._start, self._active_rows = 0, None, 0
        self._trim()

    def _write(self, first: int, end: int, terminated: Optional[bool]) -> None:
        """Write steps ``first .. end - 1`` of the active episode to shared memory; with
        ``terminated`` set, as the episode's end (the final row after them: zeros, or
        the step at ``end``, the last observation of a cut episode)."""
        if end <= first:
            return
        ebuf, active = self._ebuf, self._active
        steps = [active.step(i) for i in range(first, end)]
        final = None
        if terminated is not None:
            src = steps[-1] if terminated else active.step(end)
            final = {"next_" + k: (np.zeros_like(v) if terminated else v) for k, v in src.items()}
        lane = self._lane()
        head = int(ebuf.engine.heads()[lane])
        if final is not None and first == 0 and len(steps) + 1 <= ebuf.lane_capacity:
            episode = {k: np.stack([s[k] for s in steps]) for k in steps[0]}
            ebuf.add_episode({**episode, **final}, terminated=bool(terminated))
        else:
            for i, step in enumerate(steps):
                last = final is not None and i == len(steps) - 1
                ebuf.add({**step, **(final if last else {})}, terminated=bool(terminated) and last,
                         truncated=terminated is False and last)
        if first == 0:
            self._start = head
        if self._limit is not None:  # runs [first row kept, rows kept, episode's first row], one per episode
            if first:
                self._rows[-1][1] += len(steps)
            else:
                self._rows.append([head, len(steps), head])
            self._stored += len(steps)
        self._active_rows += len(steps)
        self._written = end

    def _lane(self) -> int:
        """This handle's lane (claimed on its first write)."""
        try:
            return self._ebuf.own_writer().lanes[0]
        except RuntimeError as e:
            if "lanes are claimed" not in str(e):
                raise
            lanes = self._ebuf.engine.ring.lanes
            raise RuntimeError(f"replay buffer {self._ebuf.name!r} has {lanes} lane(s) for appending processes, "
                               f"and live processes hold them all: create it with ReplayBuffer(..., lanes={lanes + 1}) "
                               "or more, one per process that appends (a process gives its lane back when it "
                               "closes its handle)") from None

    def _room(self, transitions: int, rows: int) -> None:
        """An InfiniteBuffer never evicts: refuse, before anything changes, what would
        take it past ``InfiniteBuffer(limit)`` transitions, or past its rows."""
        if self._config["kind"] != "infinite":
            return
        limit = self._config.get("limit")
        if limit is not None and self.transition_count + transitions > limit:  # type: ignore[attr-defined]
            raise ValueError(f"the InfiniteBuffer is full ({limit} transitions, and it never evicts): create "
                             "it with InfiniteBuffer(limit=...) larger, or use FIFOBuffer(limit)")
        lane = self._lane()
        if self._ebuf.core.lane_sizes()[lane] + rows > self._ebuf.lane_capacity:
            raise ValueError(f"the InfiniteBuffer is full ({self._ebuf.lane_capacity} rows, and it never "
                             "evicts): create it with InfiniteBuffer(limit=...) larger, or use FIFOBuffer(limit)")

    def _trim(self) -> None:
        """A FIFO: drop this lane's oldest transitions until it holds, with the active
        episode's, no more than ``limit`` (d3rlpy's deque of transitions). Each step
        row but the active episode's newest is a transition. The ring forgets whole
        episodes only: the steps of the oldest episode before ``_cut`` stay readable (as
        its frames and n-step rows, as d3rlpy keeps them) but are not drawn."""
        if self._limit is None or not self._rows:
            return
        first, end = self._local()  # type: ignore[attr-defined]
        drop = self._stored - self._active_rows - max(self._limit - (end - first), 0)
        if drop <= 0:
            return
        self._stored -= drop
        while drop:
            run = self._rows[0]
            k = min(drop, run[1])
            run[0], run[1], drop = run[0] + k, run[1] - k, drop - k
            if not run[1]:
                self._rows.popleft()
        lane = self._lane()
        ring = self._ebuf.engine.ring
        oldest = self._rows[0] if self._rows else None
        self._cut = None if oldest is None else oldest[0]
        self._cut_start = None if oldest is None else oldest[2]
        ring.trim(lane, int(self._ebuf.engine.heads()[lane]) if oldest is None else oldest[2],
                  self._ebuf.engine.seconds(None))

    def append_episode(self, episode: Any) -> None:
        """Append a whole episode (ours or d3rlpy's): its ``transition_count``
        transitions become sampleable at once."""
        obs = episode.observations if self._tuple else [episode.observations]
        fields = self._ebuf.fields
        data = {o: np.asarray(v) for o, v in zip(self._obs, obs)}
        data["action"] = np.asarray(episode.actions).reshape((len(episode.actions),) + fields["action"][0])
        data["reward"] = np.asarray(episode.rewards, np.float64).reshape(len(episode.actions))
        steps = len(data["action"]) - (not episode.terminated)
        if steps <= 0:
            return
        self._room(steps, steps + 1)
        saved = self._active, self._written, self._start, self._active_rows
        data = {k: np.asarray(v, self._ebuf.user_fields[k][1]) for k, v in data.items()}
        self._active = d3rlpy_episodes.Active.of(data, self._obs)
        self._written, self._start, self._active_rows = 0, None, 0
        try:
            self._write(0, steps, bool(episode.terminated))
        finally:
            self._active, self._written, self._start, self._active_rows = saved
        self._trim()

