"""d3rlpy's ``MixedReplayBuffer`` over two :class:`shmbuf.compat.d3rlpy.ReplayBuffer`."""

from __future__ import annotations

from typing import Any, BinaryIO

import dataclasses

import numpy as np


class MixedReplayBuffer:
    """d3rlpy's ``MixedReplayBuffer``: appends go to the primary; a batch takes
    ``int((1 - ratio) * B)`` from the primary and the rest from the secondary."""

    def __init__(self, primary_replay_buffer: Any, secondary_replay_buffer: Any,
                 secondary_mix_ratio: float) -> None:
        assert 0.0 <= secondary_mix_ratio <= 1.0
        self._primary, self._secondary = primary_replay_buffer, secondary_replay_buffer
        self._ratio = secondary_mix_ratio

    def append(self, observation: Any, action: Any, reward: Any) -> None:
        self._primary.append(observation, action, reward)

    def append_episode(self, episode: Any) -> None:
        self._primary.append_episode(episode)

    def clip_episode(self, terminated: bool) -> None:
        self._primary.clip_episode(terminated)

    def _split(self, batch_size: int) -> tuple[int, int]:
        first = int((1 - self._ratio) * batch_size)
        return first, batch_size - first

    def sample_transition_batch(self, batch_size: int) -> Any:
        a, b = self._split(batch_size)
        return _concat([self._primary.sample_transition_batch(a), self._secondary.sample_transition_batch(b)])

    def sample_trajectory_batch(self, batch_size: int, length: int) -> Any:
        a, b = self._split(batch_size)
        return _concat([self._primary.sample_trajectory_batch(a, length),
                        self._secondary.sample_trajectory_batch(b, length)])

    def sample_transition(self) -> Any:
        raise NotImplementedError("MixedReplayBuffer does not support sample_transition.")

    def sample_trajectory(self, length: int) -> Any:
        raise NotImplementedError("MixedReplayBuffer does not support sample_trajectory.")

    def dump(self, f: BinaryIO) -> None:
        raise NotImplementedError("dump is not supported yet.")

    @classmethod
    def load(cls, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("load is not supported yet.")

    def size(self) -> int:
        return self._primary.size() + self._secondary.size()

    @property
    def transition_count(self) -> int:
        return self._primary.transition_count + self._secondary.transition_count

    @property
    def episodes(self) -> list[Any]:
        return self._primary.episodes + self._secondary.episodes

    @property
    def dataset_info(self) -> Any:
        return self._primary.dataset_info


def _concat(batches: list[Any]) -> Any:
    """Two mini-batches of one type as one (the fields that are arrays joined)."""
    fields = {}
    for f in dataclasses.fields(batches[0]):
        values = [getattr(b, f.name) for b in batches]
        if f.name == "transitions":
            fields[f.name] = [t for v in values for t in v]
        elif isinstance(values[0], np.ndarray):
            fields[f.name] = np.concatenate(values)
        elif isinstance(values[0], list):
            fields[f.name] = [np.concatenate(parts) for parts in zip(*values)]
        else:
            fields[f.name] = values[0]
    return type(batches[0])(**fields)
