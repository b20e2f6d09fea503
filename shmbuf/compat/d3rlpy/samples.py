"""The sampling half of the d3rlpy facade's ``ReplayBuffer`` (behaviour of d3rlpy 2.8.1).

A batch draws from two populations in proportion to their sizes, so that it is uniform
over every transition d3rlpy would count: the transitions in shared memory (other
episodes, and other processes'), read through the engine's one read path, and this
process's episode in progress, made out of its own memory by the picker or slicer, as
d3rlpy makes them. Shared-memory draws of the active episode's rows are drawn again.

d3rlpy's built-in pickers and slicers (and this package's) are read straight out of
shared memory (:func:`shmbuf.compat.d3rlpy.pickers.describe`); any other callable gets
each episode read out of it through the checked gather, as a d3rlpy ``Episode``.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import numpy as np

from shmbuf.core.batch import count as _count_arg
from shmbuf.core.read import Sampler, read
from shmbuf.episodes import trajectories as _trajectories
from shmbuf.episodes import transitions as _transitions
from shmbuf.compat.d3rlpy import episodes as d3rlpy_episodes
from shmbuf.compat.d3rlpy.pickers import stack_trajectories, stack_transitions
from shmbuf.compat.d3rlpy.types import TrajectoryMiniBatch, TransitionMiniBatch, build


class Samples:
    """Mixin of :class:`shmbuf.compat.d3rlpy.ReplayBuffer`: ``sample_transition_batch``,
    ``sample_transition``, ``sample_trajectory_batch``, ``sample_trajectory``."""

    _ebuf: Any
    _active: Any
    _obs: list
    _tuple: bool
    _start: Optional[int]
    _picked: Optional[dict]
    _sliced: Optional[dict]
    _transition_picker: Any
    _trajectory_slicer: Any

    def _local(self) -> tuple[int, int]:
        """(first index, end) of the active episode's transitions sampled out of this
        process (a FIFO's newest ``limit``; none before the clip with write_at_termination)."""
        end = 0 if self._write_at_termination else self._active.transition_count  # type: ignore[attr-defined]
        limit = self._limit  # type: ignore[attr-defined]
        return (0 if limit is None else max(end - limit, 0)), end

    def _populations(self) -> tuple[int, int, int]:
        """:meth:`_local`, and how many transitions shared memory holds besides them
        (a scan of the lane table: not for every append)."""
        first, end = self._local()
        shared = self._ebuf.transition_count - max(self._active_rows - 1, 0)  # type: ignore[attr-defined]
        shared -= self._below()  # type: ignore[attr-defined]
        return first, end, max(shared, 0)

    def _split(self, batch_size: int) -> tuple[int, np.ndarray]:
        """How many of a batch come out of shared memory, and the indices of the active
        episode's transitions for the rest (drawn in proportion to the counts)."""
        batch_size = _count_arg(batch_size, "batch_size")
        first, end, shared = self._populations()
        local = end - first
        if local + shared == 0:
            raise ValueError("the replay buffer holds no transition yet: append two steps of an episode, "
                             "or a whole episode, first")
        rng = self._ebuf.engine.rng
        k = int(rng.binomial(batch_size, local / (local + shared))) if local else 0
        return batch_size - k, (rng.integers(first, end, k) if k else np.zeros(0, np.int64))

    def _skip(self, drawn: dict[str, np.ndarray]) -> np.ndarray:
        """Draws to draw again: the active episode's (sampled out of this process
        instead), and a FIFO's evicted rows still in the ring (see ``_trim``)."""
        lane, cut = drawn["_lane"], self._cut  # type: ignore[attr-defined]
        if self._start is None and cut is None:
            return np.zeros(len(lane), bool)
        mine = lane == self._lane()  # type: ignore[attr-defined]
        skip = mine & (drawn["_start"] == self._start) if self._start is not None else np.zeros(len(lane), bool)
        return skip | (mine & (drawn["_seq"] < cut)) if cut is not None else skip

    def _shared(self, inner: Sampler, n: int, timeout: float, call: Optional[Callable[[Any, int], Any]] = None
                ) -> dict[str, np.ndarray]:
        """``n`` items of ``inner`` (a sampler of transitions or trajectories that says
        where each was read: ``_lane``, ``_start``, ``_seq``) out of shared memory, the
        active episode's drawn again (they are sampled here); with ``call``, also
        ``call(episode, index)`` of each, in ``"_item"``."""
        return read(_Skipping(inner, self._skip, call, self._ebuf, self._obs), n, timeout)

    def _episodes_at(self, n: int, timeout: float, call: Callable[[Any, int], Any]) -> list[Any]:
        """``call(episode, index)`` on ``n`` transitions drawn out of shared memory, each
        episode read through the checked gather (the slow path, for any picker or slicer)."""
        inner = _transitions.uniformly(self._ebuf, 1, 0.99, where=True)
        return list(self._shared(inner, n, timeout, call)["_item"])

    def sample_transition_batch(self, batch_size: int) -> Any:
        """``batch_size`` transitions, uniformly over those held, made by the picker: a
        ``TransitionMiniBatch`` (float32; ``(B, 1)`` rewards, terminals, intervals)."""
        shared, local = self._split(batch_size)
        return self._ebuf.engine.sample(len(local) + shared, len(local) + shared, None,
                                        lambda t: self._transition_batch(shared, local, t))

    def _transition_batch(self, shared: int, local: np.ndarray, timeout: float) -> Any:
        picker = self._transition_picker
        parts = []
        if shared and self._picked is not None and self._picked["n_frames"] == self._ebuf.frame_stack:
            parts.append(self._fast_transitions(shared, timeout))
        elif shared:
            parts.append(stack_transitions(self._episodes_at(shared, timeout, picker)))
        if len(local):
            parts.append(stack_transitions([picker(self._active, int(i)) for i in local]))
        return build("TransitionMiniBatch", TransitionMiniBatch, _join(parts))

    def _fast_transitions(self, n: int, timeout: float) -> dict[str, Any]:
        """``n`` transitions of a built-in picker, read straight out of shared memory."""
        ebuf, n_step = self._ebuf, self._picked["n_steps"]
        b = self._shared(_transitions.uniformly(ebuf, n_step, self._picked["gamma"], where=True), n, timeout)
        stacked = ebuf.frame_stack > 1
        action, next_action = (b["action"][:, -1], b["next_action"][:, -1]) if stacked else (b["action"], b["next_action"])
        terminal = b["terminated"]  # (the next observation and action after it: zeros)
        if stacked:
            next_action = np.where(terminal.reshape((-1,) + (1,) * (next_action.ndim - 1)), 0, next_action)
        reward = b["reward"][:, -1] if stacked and n_step == 1 else b["reward"]
        return dict(observations=self._observations(b, "", None), actions=action.astype(np.float32),
                    rewards=reward.astype(np.float32)[:, None],
                    next_observations=self._observations(b, "next_", terminal if stacked else None),
                    next_actions=next_action.astype(np.float32), terminals=terminal.astype(np.float32)[:, None],
                    intervals=b.get("steps", np.ones(n)).astype(np.float32)[:, None])

    def _observations(self, batch: dict[str, np.ndarray], prefix: str, zero: Optional[np.ndarray]) -> Any:
        out = []
        for o in self._obs:
            a = batch[prefix + o].astype(np.float32, copy=False)
            if self._ebuf.frame_stack > 1 and a.ndim > 2:  # (B, k, C, ...) -> (B, k*C, ...)
                a = a.reshape((len(a), -1) + a.shape[3:])
            if zero is not None and zero.any():  # a stack after a terminal step: all zeros
                a = a.copy()
                a[zero] = 0
            out.append(a)
        return out if self._tuple else out[0]

    def sample_transition(self) -> Any:
        """One transition, made by the picker (a d3rlpy ``Transition`` where installed)."""
        shared, local = self._split(1)
        if len(local):
            return self._transition_picker(self._active, int(local[0]))
        return self._ebuf.engine.sample(1, 1, None, lambda t: self._episodes_at(1, t, self._transition_picker))[0]

    def sample_trajectory_batch(self, batch_size: int, length: int) -> Any:
        """``batch_size`` windows of ``length`` steps made by the slicer, each ending at
        a transition drawn uniformly: a ``TrajectoryMiniBatch`` of ``(B, L, ...)`` float32."""
        length = _count_arg(length, "length", 1)
        shared, local = self._split(batch_size)
        return self._ebuf.engine.sample(len(local) + shared, len(local) + shared, None,
                                        lambda t: self._trajectory_batch(shared, local, length, t))

    def _trajectory_batch(self, shared: int, local: np.ndarray, length: int, timeout: float) -> Any:
        slicer = self._trajectory_slicer
        call = lambda episode, index: slicer(episode, index, length)  # noqa: E731
        parts = []
        if shared and self._sliced is not None:
            parts.append(self._fast_trajectories(shared, length, timeout))
        elif shared:
            parts.append(stack_trajectories(self._episodes_at(shared, timeout, call)))
        if len(local):
            parts.append(stack_trajectories([call(self._active, int(i)) for i in local]))
        return build("TrajectoryMiniBatch", TrajectoryMiniBatch, {**_join(parts), "length": length})

    def _fast_trajectories(self, n: int, length: int, timeout: float) -> dict[str, Any]:
        t = self._shared(_trajectories.Trajectories(self._ebuf, length, where=True), n, timeout)
        obs = [t[o].astype(np.float32) for o in self._obs]
        return dict(observations=obs if self._tuple else obs[0], actions=t["action"].astype(np.float32),
                    rewards=t["reward"].astype(np.float32)[..., None],
                    returns_to_go=t["returns_to_go"].astype(np.float32)[..., None],
                    terminals=t["terminated"].astype(np.float32)[..., None],
                    timesteps=t["timestep"].astype(np.float32), masks=t["mask"].astype(np.float32))

    def sample_trajectory(self, length: int) -> Any:
        """One window, made by the slicer (a d3rlpy ``PartialTrajectory`` where installed)."""
        length = _count_arg(length, "length", 1)
        shared, local = self._split(1)
        call = lambda episode, index: self._trajectory_slicer(episode, index, length)  # noqa: E731
        if len(local):
            return call(self._active, int(local[0]))
        return self._ebuf.engine.sample(1, 1, None, lambda t: self._episodes_at(1, t, call))[0]


class _Skipping(Sampler):
    """``inner``, with the draws of the facade's active episode (and a FIFO's evicted
    rows still in the ring) rejected, to be drawn again; with ``call``, each item made
    by ``call(episode, index)`` too, its episode read once per call."""

    def __init__(self, inner: Sampler, skip: Callable[[dict], np.ndarray], call: Optional[Callable[[Any, int], Any]],
                 ebuf: Any, obs: list) -> None:
        self.inner, self.skip, self.call, self.ebuf, self.obs = inner, skip, call, ebuf, obs
        self.what, self.hint, self.check = inner.what, inner.hint, inner.check  # type: ignore[method-assign]
        self.episodes: dict[tuple[int, int], Any] = {}

    def empty(self, m: int) -> dict[str, np.ndarray]:
        out = self.inner.empty(m)
        if self.call is not None:
            out["_item"] = np.empty(m, object)
        return out

    def spare(self, m: int, rounds: int) -> int:
        return self.inner.spare(m, rounds)

    def draw(self, todo: np.ndarray, rounds: int, deadline: float) -> Any:
        return self.inner.draw(todo, rounds, deadline)

    def gather(self, drawn: Any, out: dict[str, np.ndarray]) -> np.ndarray | None:
        ok = self.inner.gather(drawn, out)
        ok = ~self.skip(out) & (True if ok is None else ok)
        if self.call is not None:
            for i in np.flatnonzero(ok).tolist():
                key = (int(out["_lane"][i]), int(out["_start"][i]))
                if key not in self.episodes:
                    self.episodes[key] = d3rlpy_episodes.read(self.ebuf, key[0], key[1], self.obs)
                episode, index = self.episodes[key], int(out["_seq"][i]) - key[1]
                ok[i] = episode is not None and index < episode.transition_count
                if ok[i]:
                    out["_item"][i] = self.call(episode, index)
        return ok


def _join(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Mini-batch fields of several parts, joined along the batch."""
    if len(parts) == 1:
        return parts[0]
    out = {}
    for k, v in parts[0].items():
        vs = [p[k] for p in parts]
        out[k] = ([np.concatenate(x) for x in zip(*vs)] if isinstance(v, list) else
                  np.concatenate(vs) if isinstance(v, np.ndarray) else v)
    return out
