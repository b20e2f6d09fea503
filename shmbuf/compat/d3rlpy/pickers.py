"""d3rlpy's transition pickers and trajectory slicers (behaviour of d3rlpy 2.8.1).

A picker is any callable ``picker(episode, index) -> Transition`` and a slicer any
callable ``slicer(episode, end_index, size) -> PartialTrajectory``, as in d3rlpy; users
write their own. The built-ins here are callable with d3rlpy's semantics on any episode
(ours, d3rlpy's, or the one a replay buffer reads out of shared memory).

:func:`describe` tells a replay buffer whether a picker or slicer is one it can serve
from shared memory without calling it (the built-ins here and d3rlpy's own classes, not
subclasses), and with which parameters. Any other callable is called on episodes read
out of shared memory, each read through the checked gather.

Examples:
    >>> import numpy as np
    >>> from shmbuf.compat.d3rlpy import Episode
    >>> ep = Episode(np.arange(4.0)[:, None], np.zeros((4, 1)), np.ones((4, 1), np.float32), True)
    >>> t = MultiStepTransitionPicker(n_steps=3, gamma=0.5)(ep, 2)
    >>> t.reward.tolist(), t.interval, t.terminal, t.next_observation.tolist()
    ([1.5], 2, 1.0, [0.0])
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

import numpy as np

from shmbuf.compat.d3rlpy.types import Trajectory, d3rlpy_module


@dataclasses.dataclass(frozen=True)
class Transition:
    """d3rlpy's ``Transition`` (used where d3rlpy is not installed)."""
    observation: Any
    action: np.ndarray
    reward: np.ndarray
    next_observation: Any
    next_action: np.ndarray
    terminal: float
    interval: int
    rewards_to_go: np.ndarray


@dataclasses.dataclass(frozen=True)
class PartialTrajectory(Trajectory):
    """d3rlpy's ``PartialTrajectory`` (used where d3rlpy is not installed)."""

    def __len__(self) -> int:
        return self.length


def _make(name: str, local: type, **fields: Any) -> Any:
    d3 = d3rlpy_module()
    return (getattr(d3, name) if d3 else local)(**fields)


# -- observations: one array, or a list of arrays (tuple observations) ---------------------

def _at(obs: Any, i: int) -> Any:
    return [o[i] for o in obs] if isinstance(obs, (list, tuple)) else obs[i]


def _zeros(obs: Any) -> Any:
    return [np.zeros_like(o) for o in obs] if isinstance(obs, (list, tuple)) else np.zeros_like(obs)


def _slice(obs: Any, start: int, end: int) -> Any:
    return [o[start:end] for o in obs] if isinstance(obs, (list, tuple)) else obs[start:end]


def _pad(a: Any, pad: int) -> Any:
    """``pad`` zero rows in front (of each array of a tuple observation)."""
    if isinstance(a, (list, tuple)):
        return [_pad(x, pad) for x in a]
    out = np.zeros((pad + len(a),) + a.shape[1:], a.dtype)
    out[pad:] = a
    return out


def _stack(obs: Any, index: int, n: int) -> Any:
    """The ``n`` latest observations up to ``index`` (zeros before the first), their
    first axes joined: ``(n * C, ...)``."""
    start = max(index - n + 1, 0)
    seq = _slice(obs, start, index + 1)
    if index + 1 - start < n:
        seq = _pad(seq, n - (index + 1 - start))
    join = lambda a: a.reshape((a.shape[0] * a.shape[1],) + a.shape[2:])  # noqa: E731
    return [join(a) for a in seq] if isinstance(seq, (list, tuple)) else join(seq)


def _check(episode: Any, index: int) -> None:
    if not 0 <= index < episode.transition_count:
        raise IndexError(f"transition {index} of an episode of {episode.transition_count} transitions")


# -- transition pickers ----------------------------------------------------------------------

class BasicTransitionPicker:
    """One-step transitions: the next observation and action, zeros after a terminal step."""

    def __call__(self, episode: Any, index: int) -> Any:
        _check(episode, index)
        return _one_step(episode, index, lambda i: _at(episode.observations, i))


def _one_step(episode: Any, index: int, observe: Any) -> Any:
    observation = observe(index)
    terminal = bool(episode.terminated) and index == episode.size() - 1
    if terminal:
        next_observation, next_action = _zeros(observation), np.zeros_like(episode.actions[index])
    else:
        next_observation, next_action = observe(index + 1), episode.actions[index + 1]
    return _make("Transition", Transition, observation=observation, action=episode.actions[index],
                 reward=episode.rewards[index], next_observation=next_observation, next_action=next_action,
                 terminal=float(terminal), interval=1, rewards_to_go=episode.rewards[index:])


class SparseRewardTransitionPicker:
    """The basic picker, with ``rewards_to_go`` of a failed episode (every reward from
    the step on equal to ``step_reward``) replaced by ``[[failure_return]]``."""

    def __init__(self, failure_return: float, step_reward: float = 0.0) -> None:
        self._failure_return, self._step_reward = failure_return, step_reward

    def __call__(self, episode: Any, index: int) -> Any:
        t = BasicTransitionPicker()(episode, index)
        if np.all(t.rewards_to_go == self._step_reward):
            t = dataclasses.replace(t, rewards_to_go=np.array([[self._failure_return]], np.float32))
        return t


class FrameStackTransitionPicker:
    """Observations of the ``n_frames`` latest frames joined on axis 0, zeros before the
    episode's first (the buffer stores each frame once)."""

    def __init__(self, n_frames: int) -> None:
        if isinstance(n_frames, bool) or not isinstance(n_frames, (int, np.integer)) or n_frames < 1:
            raise ValueError(f"n_frames must be an int >= 1, got {n_frames!r}")
        self._n_frames = int(n_frames)

    def __call__(self, episode: Any, index: int) -> Any:
        _check(episode, index)
        return _one_step(episode, index, lambda i: _stack(episode.observations, i, self._n_frames))


class MultiStepTransitionPicker:
    """n-step transitions: ``reward`` the discounted sum over up to ``n_steps`` steps of
    the episode, ``interval`` how many were taken, the observation after them next
    (zeros, and ``terminal``, where a terminated episode ends within them)."""

    def __init__(self, n_steps: int, gamma: float) -> None:
        if isinstance(n_steps, bool) or not isinstance(n_steps, (int, np.integer)) or n_steps < 1:
            raise ValueError(f"n_steps must be an int >= 1, got {n_steps!r}")
        self._n_steps, self._gamma = int(n_steps), float(gamma)

    def __call__(self, episode: Any, index: int) -> Any:
        _check(episode, index)
        observation, size = _at(episode.observations, index), episode.size()
        if episode.terminated:
            nxt = min(index + self._n_steps, size)
            terminal = nxt == size
        else:
            nxt, terminal = min(index + self._n_steps, size - 1), False
        if terminal:
            next_observation, next_action = _zeros(observation), np.zeros_like(episode.actions[index])
        else:
            next_observation, next_action = _at(episode.observations, nxt), episode.actions[nxt]
        interval = nxt - index
        gammas = (self._gamma ** np.arange(interval))[:, None]
        reward = np.sum(episode.rewards[index:nxt] * gammas, axis=0)
        return _make("Transition", Transition, observation=observation, action=episode.actions[index],
                     reward=reward, next_observation=next_observation, next_action=next_action,
                     terminal=float(terminal), interval=interval, rewards_to_go=episode.rewards[index:])


# -- trajectory slicers ----------------------------------------------------------------------

class BasicTrajectorySlicer:
    """The ``size`` steps ending at ``end_index``, front-padded with zeros: returns-to-go
    to the episode's end, 1-based timesteps, masks (0 on padding), the terminal flag on
    a terminated episode's last step."""

    def __call__(self, episode: Any, end_index: int, size: int) -> Any:
        start = max(end_index + 1 - size, 0)
        return _trajectory(episode, start, end_index + 1, size, _slice(episode.observations, start, end_index + 1))


class FrameStackTrajectorySlicer:
    """:class:`BasicTrajectorySlicer` with each step's observation the stack of its
    ``n_frames`` latest frames ``(n_frames * C, ...)`` (one observation array only)."""

    def __init__(self, n_frames: int) -> None:
        if isinstance(n_frames, bool) or not isinstance(n_frames, (int, np.integer)) or n_frames < 1:
            raise ValueError(f"n_frames must be an int >= 1, got {n_frames!r}")
        self._n_frames = int(n_frames)

    def __call__(self, episode: Any, end_index: int, size: int) -> Any:
        if isinstance(episode.observations, (list, tuple)):
            raise ValueError("FrameStackTrajectorySlicer takes one observation array (tuple observations "
                             "are not supported, as in d3rlpy)")
        start = max(end_index + 1 - size, 0)
        stacked = np.stack([_stack(episode.observations, i, self._n_frames).astype(np.float64)
                            for i in range(start, end_index + 1)])
        return _trajectory(episode, start, end_index + 1, size, stacked)


def _trajectory(episode: Any, start: int, end: int, size: int, observations: Any) -> Any:
    actual = end - start
    terminals = np.zeros((actual, 1), np.float32)
    if episode.terminated and end == episode.size():
        terminals[-1, 0] = 1.0
    rewards = episode.rewards[start:]
    returns = (np.sum(rewards) - np.cumsum(rewards, axis=0) + rewards)[:actual].reshape(-1, 1)
    parts = dict(observations=observations, actions=episode.actions[start:end], rewards=episode.rewards[start:end],
                 returns_to_go=returns, terminals=terminals, timesteps=np.arange(start, end) + 1,
                 masks=np.ones(actual, np.float32))
    pad = size - actual
    if pad:
        parts = {k: _pad(v, pad) for k, v in parts.items()}
    return _make("PartialTrajectory", PartialTrajectory, **parts, length=size)


# -- which ones a replay buffer serves from shared memory -------------------------------------

_OURS = {BasicTransitionPicker: "basic", SparseRewardTransitionPicker: "sparse",
         FrameStackTransitionPicker: "frames", MultiStepTransitionPicker: "n_step",
         BasicTrajectorySlicer: "basic"}


def describe(part: Any) -> Optional[dict[str, Any]]:
    """``{"kind", "n_steps", "gamma", "n_frames"}`` for a picker or slicer a replay
    buffer reads from shared memory without calling it (this module's and d3rlpy's
    built-ins, exactly those classes); None for any other callable."""
    kind = _OURS.get(type(part))
    if kind is None:
        cls = type(part)
        if not cls.__module__.startswith("d3rlpy.dataset"):
            return None
        kind = {"BasicTransitionPicker": "basic", "SparseRewardTransitionPicker": "sparse",
                "FrameStackTransitionPicker": "frames", "MultiStepTransitionPicker": "n_step",
                "BasicTrajectorySlicer": "basic"}.get(cls.__name__)
        if kind is None:
            return None
    return {"kind": kind, "n_steps": int(getattr(part, "_n_steps", 1)), "gamma": float(getattr(part, "_gamma", 0.99)),
            "n_frames": int(getattr(part, "_n_frames", 1))}


def check_callable(part: Any, what: str, signature: str) -> None:
    if part is not None and not callable(part):
        raise TypeError(f"{what} must be callable as {signature} (d3rlpy's protocol), got {type(part).__name__}")


def stack_transitions(transitions: Sequence[Any]) -> dict[str, Any]:
    """The fields of a ``TransitionMiniBatch`` from picked transitions (float32)."""
    first = transitions[0].observation
    f32 = lambda xs: np.stack(xs).astype(np.float32)  # noqa: E731
    obs = lambda name: ([f32([getattr(t, name)[j] for t in transitions]) for j in range(len(first))]  # noqa: E731
                        if isinstance(first, (list, tuple)) else f32([getattr(t, name) for t in transitions]))
    return dict(observations=obs("observation"), actions=f32([t.action for t in transitions]),
                rewards=f32([t.reward for t in transitions]), next_observations=obs("next_observation"),
                next_actions=f32([t.next_action for t in transitions]),
                terminals=np.array([t.terminal for t in transitions], np.float32).reshape(-1, 1),
                intervals=np.array([t.interval for t in transitions], np.float32).reshape(-1, 1))


def stack_trajectories(trajectories: Sequence[Any]) -> dict[str, Any]:
    """The fields of a ``TrajectoryMiniBatch`` from sliced trajectories (float32)."""
    first = trajectories[0].observations
    f32 = lambda xs: np.stack(xs).astype(np.float32)  # noqa: E731
    obs = ([f32([t.observations[j] for t in trajectories]) for j in range(len(first))]
           if isinstance(first, (list, tuple)) else f32([t.observations for t in trajectories]))
    return dict(observations=obs, **{k: f32([getattr(t, k) for t in trajectories])
                                     for k in ("actions", "rewards", "returns_to_go", "terminals", "timesteps",
                                               "masks")}, length=int(trajectories[0].length))
