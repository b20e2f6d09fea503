"""What d3rlpy's own ``ReplayBuffer`` holds, to compare the facade with it.

Where d3rlpy is installed (``scripts/test-libraries``) the reference is d3rlpy's
``ReplayBuffer`` itself, over d3rlpy's ``FIFOBuffer`` / ``InfiniteBuffer`` and pickers.
Elsewhere it is :class:`MiniReplayBuffer`: d3rlpy's writer (``ExperienceWriter``: a
transition appended per step once the episode has two, the terminal one at
``clip_episode(True)``, a one-step episode kept going) over the facade module's buffers
and pickers, which are ports of d3rlpy's and are checked against d3rlpy's there.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import numpy as np

HAVE_D3RLPY = importlib.util.find_spec("d3rlpy") is not None


class _Live:
    """d3rlpy's active episode: one object, growing, that the buffer refers to."""

    def __init__(self) -> None:
        self.steps: list = []
        self.terminated = False

    @property
    def observations(self) -> np.ndarray:
        return np.stack([s[0] for s in self.steps])

    @property
    def actions(self) -> np.ndarray:
        return np.stack([s[1] for s in self.steps])

    @property
    def rewards(self) -> np.ndarray:
        return np.array([[s[2]] for s in self.steps], np.float32)

    def size(self) -> int:
        return len(self.steps)

    @property
    def transition_count(self) -> int:
        return self.size() if self.terminated else self.size() - 1


class MiniReplayBuffer:
    """d3rlpy's ``ReplayBuffer`` write and pick logic (see the module)."""

    def __init__(self, buffer: Any, picker: Any, slicer: Any) -> None:
        self.buffer, self.transition_picker, self.trajectory_slicer = buffer, picker, slicer
        self.live = _Live()

    def append(self, observation: Any, action: Any, reward: Any) -> None:
        self.live.steps.append((np.asarray(observation), np.asarray(action).reshape(-1), float(reward)))
        if self.live.transition_count > 0:
            self.buffer.append(self.live, self.live.transition_count - 1)

    def clip_episode(self, terminated: bool) -> None:
        if self.live.transition_count == 0:
            return
        self.live.terminated = bool(terminated)
        if terminated:
            self.buffer.append(self.live, self.live.transition_count - 1)
        self.live = _Live()

    def append_episode(self, episode: Any) -> None:
        for i in range(episode.transition_count):
            self.buffer.append(episode, i)

    @property
    def transition_count(self) -> int:
        return self.buffer.transition_count

    def size(self) -> int:
        return len(self.buffer.episodes)


def parts() -> Any:
    """The module whose pickers and slicers the tests pass: d3rlpy's ``dataset`` where
    installed (its own objects, given to the facade), else the facade module."""
    if HAVE_D3RLPY:
        import d3rlpy

        return d3rlpy.dataset
    from shmbuf.compat.d3rlpy import replay as facade

    return facade


def reference(kind: str, limit: int | None = None, picker: Any = None, slicer: Any = None,
              own: bool = False) -> Any:
    """An empty reference replay buffer: ``kind`` "fifo" or "infinite"; ``own``: the
    mini one even where d3rlpy is installed (where d3rlpy fails: ``FIFOBuffer(1)``)."""
    if HAVE_D3RLPY and not own:
        import d3rlpy

        from shmbuf.compat.d3rlpy import Signature

        ds = d3rlpy.dataset
        buffer = ds.FIFOBuffer(limit) if kind == "fifo" else ds.InfiniteBuffer()
        return ds.ReplayBuffer(buffer, transition_picker=picker, trajectory_slicer=slicer,
                               observation_signature=Signature(dtype=[np.float32], shape=[(2,)]),
                               action_signature=Signature(dtype=[np.int64], shape=[(1,)]),
                               reward_signature=Signature(dtype=[np.float32], shape=[(1,)]),
                               action_space=d3rlpy.constants.ActionSpace.DISCRETE, action_size=1000)
    from shmbuf.compat.d3rlpy import replay as facade

    buffer = facade.FIFOBuffer(limit) if kind == "fifo" else facade.InfiniteBuffer()
    return MiniReplayBuffer(buffer, picker or facade.BasicTransitionPicker(),
                            slicer or facade.BasicTrajectorySlicer())


def transition_key(t: Any) -> tuple:
    """A transition as a tuple of plain numbers (float32, as mini-batches carry them)."""
    f = lambda a: tuple(np.asarray(a, np.float32).ravel().tolist())  # noqa: E731
    return (f(t.observation), f(t.action), f(t.reward), f(t.next_observation), f(t.next_action),
            float(t.terminal), int(t.interval))


def every_transition(ref: Any) -> set:
    """The reference's transitions, each made by its picker."""
    picker = ref.transition_picker
    return {transition_key(picker(*ref.buffer[i])) for i in range(ref.buffer.transition_count)}


def batch_keys(batch: Any) -> set:
    """The distinct transitions of a mini-batch."""
    f = lambda a: tuple(np.asarray(a, np.float32).ravel().tolist())  # noqa: E731
    return {(f(batch.observations[i]), f(batch.actions[i]), f(batch.rewards[i]), f(batch.next_observations[i]),
             f(batch.next_actions[i]), float(batch.terminals[i, 0]), int(batch.intervals[i, 0]))
            for i in range(len(batch.actions))}


def trajectory_key(t: Any) -> tuple:
    f = lambda a: tuple(np.asarray(a, np.float32).ravel().tolist())  # noqa: E731
    return tuple(f(getattr(t, k)) for k in ("observations", "actions", "rewards", "returns_to_go", "terminals",
                                           "timesteps", "masks"))


def every_trajectory(ref: Any, length: int) -> set:
    slicer = ref.trajectory_slicer
    return {trajectory_key(slicer(*ref.buffer[i], length)) for i in range(ref.buffer.transition_count)}


def trajectory_keys(batch: Any) -> set:
    f = lambda a: tuple(np.asarray(a, np.float32).ravel().tolist())  # noqa: E731
    names = ("observations", "actions", "rewards", "returns_to_go", "terminals", "timesteps", "masks")
    return {tuple(f(getattr(batch, k)[i]) for k in names) for i in range(len(batch.actions))}
