"""d3rlpy's ``ReplayBuffer`` and its parts, over an :class:`shmbuf.EpisodeBuffer`
(behaviour of d3rlpy 2.8.1, takuseno/d3rlpy at 38c34b6).

Switch with one import::

    from shmbuf.compat.d3rlpy import (ReplayBuffer, FIFOBuffer, InfiniteBuffer, Signature, Episode,
        ActionSpace, BasicTransitionPicker, MultiStepTransitionPicker, FrameStackTransitionPicker,
        SparseRewardTransitionPicker, BasicTrajectorySlicer, FrameStackTrajectorySlicer,
        MixedReplayBuffer, dump, load)

``ReplayBuffer(buffer, transition_picker=None, trajectory_slicer=None, ..., episodes=None,
env=None, observation_signature=None, ...)`` works out its signatures as d3rlpy does and
keeps its episodes in shared memory: ``FIFOBuffer(limit)`` keeps the newest ``limit``
transitions, ``InfiniteBuffer()`` keeps all (its segment holds its ``episodes``, or
``InfiniteBuffer(limit)`` transitions, default 1,000,000, and an append past that
raises). ``append(observation, action, reward)`` / ``clip_episode(terminated)`` count
transitions as d3rlpy counts them (after ``k`` appends of an episode in progress,
``k - 1``), and every one counted is sampled. Pickers and slicers are d3rlpy's
protocols: d3rlpy's built-ins and this module's are read straight out of shared memory,
any other callable is called on episodes read out of it (each row stamp-checked).
Where d3rlpy is installed the mini-batches, transitions, trajectories, episodes and
``dataset_info`` are d3rlpy's own types, so its algorithms take the buffer
(``algo.fit_online(env, buffer=...)``, ``algo.fit(buffer, ...)``).

Another process attaches with ``ReplayBuffer.attach(name)`` and appends through a lane
of its own: create the buffer with ``lanes=`` one per process that appends (shared
memory is reserved up front, lane by lane). The learner samples every lane. Steps of
another process's episode in progress become sampleable two appends after it makes
them (the writer holds the newest two until it knows how its episode goes on); this
process's own are sampled at once, out of its memory, as in d3rlpy.

Divergences (docs/migrate/d3rlpy.md): a FIFO keeps ``limit`` transitions per appending process;
``episodes`` and ``dump`` hold the complete episodes and the episode in progress (d3rlpy
also keeps an episode whose oldest transitions a FIFO dropped); mini-batches carry no
``transitions`` list (Cal-QL is not supported); the reward of a cut episode's last step
is not kept in shared memory. Sampling uses the handle's own seeded generator.

Examples:
    >>> import numpy as np
    >>> obs = Signature(dtype=[np.float32], shape=[(2,)])
    >>> buf = ReplayBuffer(FIFOBuffer(100), observation_signature=obs, seed=0,
    ...                    action_signature=Signature(dtype=[np.int64], shape=[(1,)]),
    ...                    reward_signature=Signature(dtype=[np.float32], shape=[(1,)]),
    ...                    action_space=ActionSpace.DISCRETE, action_size=2)
    >>> for t in range(3):
    ...     buf.append(np.full(2, t, np.float32), t % 2, 1.0)
    >>> buf.transition_count
    2
    >>> buf.clip_episode(True)
    >>> buf.transition_count, buf.size()
    (3, 1)
    >>> b = buf.sample_transition_batch(4)
    >>> b.observations.shape, b.rewards.shape, b.terminals.dtype
    ((4, 2), (4, 1), dtype('float32'))
    >>> buf.close()
"""

from __future__ import annotations

from collections import deque
from typing import Any, BinaryIO, Callable, Optional, Sequence

import numpy as np

from shmbuf.core.batch import count as _count_arg
from shmbuf.episodes import EpisodeBuffer
from shmbuf.compat.d3rlpy import episodes as d3rlpy_episodes
from shmbuf.compat.d3rlpy.buffers import FIFOBuffer, InfiniteBuffer, kind_of
from shmbuf.compat.d3rlpy.dump import VERSION, dump, load
from shmbuf.compat.d3rlpy.mixed import MixedReplayBuffer
from shmbuf.compat.d3rlpy.pickers import (BasicTrajectorySlicer, BasicTransitionPicker, FrameStackTrajectorySlicer,
                             FrameStackTransitionPicker, MultiStepTransitionPicker, PartialTrajectory,
                             SparseRewardTransitionPicker, Transition, check_callable, describe)
from shmbuf.compat.d3rlpy.samples import Samples
from shmbuf.compat.d3rlpy.types import (ActionSpace, DatasetInfo, Episode, EpisodeGenerator, Signature, TrajectoryMiniBatch,
                           TransitionMiniBatch, d3rlpy_module, episode_class)
from shmbuf.compat.d3rlpy.writes import Appends
from shmbuf.compat.shared import Shared

__all__ = ["ActionSpace", "BasicTrajectorySlicer", "BasicTransitionPicker", "DatasetInfo", "Episode",
           "EpisodeGenerator", "FIFOBuffer", "FrameStackTrajectorySlicer", "FrameStackTransitionPicker",
           "InfiniteBuffer", "MixedReplayBuffer", "MultiStepTransitionPicker", "PartialTrajectory", "ReplayBuffer",
           "Signature", "SparseRewardTransitionPicker", "TrajectoryMiniBatch", "Transition", "TransitionMiniBatch",
           "VERSION", "create_fifo_replay_buffer", "create_infinite_replay_buffer", "dump", "load"]

DEFAULT_LIMIT = 1_000_000  # an InfiniteBuffer's rows when neither its episodes nor limit= say


def _signature_from_env(space: Any, action: bool) -> Signature:
    shape = tuple(space.shape)
    return Signature(dtype=[np.dtype(space.dtype)], shape=[shape if shape or not action else (1,)])


def _signatures(episodes: list, env: Any, observation_signature: Any, action_signature: Any,
                reward_signature: Any) -> tuple[Any, Any, Any]:
    if observation_signature and action_signature and reward_signature:
        return observation_signature, action_signature, reward_signature
    if episodes:
        e = episodes[0]
        return e.observation_signature, e.action_signature, e.reward_signature
    if env is not None:
        return (_signature_from_env(env.observation_space, False), _signature_from_env(env.action_space, True),
                Signature(dtype=[np.dtype(np.float32)], shape=[[1]]))
    raise ValueError("Either episodes or env must be provided to determine signatures. "
                     "Or specify signatures directly.")


def _action_space_and_size(episodes: list, env: Any, action_signature: Any, action_space: Any,
                           action_size: Optional[int]) -> tuple[ActionSpace, int]:
    if action_space is not None:
        action_space = ActionSpace(getattr(action_space, "value", action_space))  # ours or d3rlpy's enum
    if action_space is None or action_size is None:
        if episodes:
            discrete = all(np.all(np.array(e.actions, dtype=np.int32) == e.actions) for e in episodes[:1])
            action_space = action_space or (ActionSpace.DISCRETE if discrete else ActionSpace.CONTINUOUS)
            if action_size is None:
                action_size = (int(action_signature.shape[0][0]) if action_space == ActionSpace.CONTINUOUS
                               else max(int(np.max(e.actions)) for e in episodes) + 1)
        elif env is not None:
            discrete = hasattr(env.action_space, "n")
            action_space = action_space or (ActionSpace.DISCRETE if discrete else ActionSpace.CONTINUOUS)
            if action_size is None:
                action_size = int(env.action_space.n if discrete else env.action_space.shape[0])
        else:
            raise ValueError("Either episodes or env must be provided to determine action_space. "
                             "Or specify action_space directly.")
    return action_space, int(action_size)


class ReplayBuffer(Appends, Samples, Shared):
    """d3rlpy's ``ReplayBuffer`` over an episode buffer in shared memory (see the module)."""

    def __init__(self, buffer: Any, transition_picker: Any = None, trajectory_slicer: Any = None,
                 writer_preprocessor: Any = None, episodes: Optional[Sequence[Any]] = None, env: Any = None,
                 observation_signature: Optional[Signature] = None, action_signature: Optional[Signature] = None,
                 reward_signature: Optional[Signature] = None, action_space: Any = None,
                 action_size: Optional[int] = None, cache_size: int = 10000, write_at_termination: bool = False,
                 *, name: Optional[str] = None, seed: Any = None, persist: bool = False, lanes: int = 1) -> None:
        episodes = list(episodes) if episodes else []
        check_callable(transition_picker, "transition_picker", "picker(episode, index)")
        check_callable(trajectory_slicer, "trajectory_slicer", "slicer(episode, end_index, size)")
        obs_sig, act_sig, rew_sig = _signatures(episodes, env, observation_signature, action_signature,
                                                reward_signature)
        action_space, action_size = _action_space_and_size(episodes, env, act_sig, action_space, action_size)
        kind, limit = kind_of(buffer)
        lanes = _count_arg(lanes, "lanes", 1)
        picked = describe(transition_picker or BasicTransitionPicker()) or {"n_steps": 1, "gamma": 0.99,
                                                                             "n_frames": 1}
        config = {"obs": [[list(map(int, s)), np.dtype(d).str] for s, d in zip(obs_sig.shape, obs_sig.dtype)],
                  "action": [list(map(int, act_sig.shape[0])) or [1], np.dtype(act_sig.dtype[0]).str],
                  "reward": [list(map(int, rew_sig.shape[0])), np.dtype(rew_sig.dtype[0]).str],
                  "action_space": int(action_space), "action_size": int(action_size), "kind": kind,
                  "limit": limit, "n_steps": picked["n_steps"], "gamma": picked["gamma"]}
        if config["reward"][0] not in ([], [1]):
            raise ValueError(f"reward_signature shape {rew_sig.shape[0]}: this facade stores one reward "
                             "per step (shape (1,))")
        frames = picked["n_frames"]
        if limit is None:  # an InfiniteBuffer: its episodes' rows, or DEFAULT_LIMIT
            rows = max(sum(len(e.actions) + 1 for e in episodes), DEFAULT_LIMIT)
        else:  # limit transitions always fit (each may come with a final row), and the episode the
            rows = 2 * limit + int(cache_size) + frames + 2  # oldest is of (cache_size: its longest), whole
        fields = {f"observation_{j}" if len(config["obs"]) > 1 else "observation": (tuple(s), d)
                  for j, (s, d) in enumerate(config["obs"])}
        observations = [*fields, "action", "reward"]  # (next_action: the next row's; a final row keeps both)
        fields.update(action=(tuple(config["action"][0]), config["action"][1]), reward=((), config["reward"][1]))
        ebuf = EpisodeBuffer.create(fields, rows * lanes, lanes=lanes, observations=observations,
                                    frame_stack=frames, name=name, seed=seed, persist=persist,
                                    _library={"d3rlpy": config})
        self._open(ebuf, transition_picker, trajectory_slicer, writer_preprocessor, cache_size,
                   write_at_termination, buffer)
        self._or_remove(lambda: [self.append_episode(e) for e in episodes])

    def _open(self, ebuf: EpisodeBuffer, picker: Any, slicer: Any, preprocessor: Any, cache_size: int,
              write_at_termination: bool, buffer: Any) -> None:
        config = ebuf.engine.layout.meta["d3rlpy"]
        self._ebuf, self._config, self._core = ebuf, config, ebuf.core
        self._buffer = buffer
        self._transition_picker = picker or BasicTransitionPicker()
        self._trajectory_slicer = slicer or BasicTrajectorySlicer()
        self._picked, self._sliced = describe(self._transition_picker), describe(self._trajectory_slicer)
        self._preprocessor = preprocessor
        self._write_at_termination = bool(write_at_termination)
        self._obs = [o for o in ebuf.observations if o not in ("action", "reward")]
        self._tuple = len(self._obs) > 1
        self._active = d3rlpy_episodes.Active(ebuf.user_fields, self._obs, cache_size)
        self._written = 0  # steps of the active episode written to shared memory
        self._start: Optional[int] = None  # the lane row of its first step, once written
        self._rows: deque[list[int]] = deque()  # a FIFO's runs [first, rows] of this handle's step rows
        self._stored = 0  # rows in those runs
        self._active_rows = 0  # of them, the active episode's
        self._limit = config.get("limit") if config["kind"] == "fifo" else None

    @classmethod
    def attach(cls, name: str, transition_picker: Any = None, trajectory_slicer: Any = None, *, seed: Any = None,
               cache_size: int = 10000, write_at_termination: bool = False) -> "ReplayBuffer":
        """This buffer from another process, by name: its signatures, buffer kind and
        picker come with it (or pass this handle's picker and slicer); ``append`` there
        writes into a lane of its own."""
        ebuf = EpisodeBuffer.attach(name, seed=seed)
        config = ebuf.engine.layout.meta.get("d3rlpy")
        if config is None:
            ebuf.close()
            raise ValueError(f"buffer {name!r} was not made by shmbuf.compat.d3rlpy.ReplayBuffer")
        self = cls.__new__(cls)
        if transition_picker is None:
            transition_picker = (FrameStackTransitionPicker(ebuf.frame_stack) if ebuf.frame_stack > 1 else
                                 MultiStepTransitionPicker(config["n_steps"], config["gamma"])
                                 if config["n_steps"] > 1 else None)
        limit = config.get("limit")
        buffer = FIFOBuffer(limit) if config["kind"] == "fifo" else InfiniteBuffer(limit)
        self._open(ebuf, transition_picker, trajectory_slicer, None, cache_size, write_at_termination, buffer)
        return self

    # -- sampling ----------------------------------------------------------------------------

    @property
    def transition_count(self) -> int:
        """Transitions held, as d3rlpy counts them: each appending process's ended
        episodes (a FIFO's newest ``limit``), and this process's episode in progress
        (``k - 1`` after ``k`` appends)."""
        first, end, shared = self._populations()
        return shared + end - first

    def size(self) -> int:
        """Episodes with a transition held (partly evicted ones and this process's
        episode in progress too)."""
        first, end, _ = self._populations()
        return self._ebuf.num_episodes - (self._active_rows > 1) + (end > 0)

    # -- counts and episodes ----------------------------------------------------------------

    @property
    def episodes(self) -> list[Any]:
        """Copies of the complete episodes held (ended, no step evicted), oldest first,
        then this process's episode in progress (once it has a transition)."""
        cls = episode_class()
        out = []
        for ep in self._ebuf.episodes():
            obs = [ep[o] for o in self._obs]
            actions, rewards = ep["action"], ep["reward"].astype(np.float32)[:, None]
            terminated = bool(ep["terminated"][-1])
            if not terminated:  # the last observation, kept as the bootstrap one
                obs = [np.concatenate([a, ep["next_" + o][-1:]]) for a, o in zip(obs, self._obs)]
                actions = np.concatenate([actions, ep["next_action"][-1:]])
                rewards = np.concatenate([rewards, ep["next_reward"][-1:, None].astype(np.float32)])
            out.append(cls(observations=obs if self._tuple else obs[0], actions=actions, rewards=rewards,
                           terminated=terminated))
        if self._populations()[1]:
            out.append(self._active.to_episode())
        return out

    @property
    def dataset_info(self) -> Any:
        """Signatures, action space and size (d3rlpy's ``DatasetInfo`` where installed)."""
        c = self._config
        d3 = d3rlpy_module()
        sig = d3.Signature if d3 else Signature
        info = dict(observation_signature=sig(dtype=[np.dtype(d) for _, d in c["obs"]],
                                              shape=[tuple(s) for s, _ in c["obs"]]),
                    action_signature=sig(dtype=[np.dtype(c["action"][1])], shape=[tuple(c["action"][0])]),
                    reward_signature=sig(dtype=[np.dtype(c["reward"][1])], shape=[tuple(c["reward"][0])]),
                    action_space=_action_space(c["action_space"]), action_size=c["action_size"])
        return (d3.DatasetInfo if d3 else DatasetInfo)(**info)

    @property
    def buffer(self) -> Any:
        """The ``FIFOBuffer`` / ``InfiniteBuffer`` this replay buffer was made with (its
        transitions are in shared memory, not in it)."""
        return self._buffer

    @property
    def transition_picker(self) -> Any:
        return self._transition_picker

    @property
    def trajectory_slicer(self) -> Any:
        return self._trajectory_slicer

    # -- files ------------------------------------------------------------------------------

    def dump(self, f: BinaryIO) -> None:
        """Write :attr:`episodes` in d3rlpy's HDF5 layout (version 2.1; h5py)."""
        episodes = self.episodes
        if not episodes:
            raise IndexError("no episode to dump")
        dump(episodes, f)

    @classmethod
    def load(cls, f: BinaryIO, buffer: Any, episode_cls: Optional[type] = None, transition_picker: Any = None,
             trajectory_slicer: Any = None, writer_preprocessor: Any = None, **kwargs: Any) -> "ReplayBuffer":
        """A new buffer over ``buffer`` holding the episodes of a :meth:`dump` file
        (``episode_cls``: d3rlpy's ``Episode`` where installed, else :class:`Episode`)."""
        return cls(buffer, transition_picker, trajectory_slicer, writer_preprocessor,
                   episodes=load(episode_cls or episode_class(), f), **kwargs)

    @classmethod
    def from_episode_generator(cls, episode_generator: Callable[[], Sequence[Any]], buffer: Any,
                               transition_picker: Any = None, trajectory_slicer: Any = None,
                               writer_preprocessor: Any = None, **kwargs: Any) -> "ReplayBuffer":
        return cls(buffer, transition_picker, trajectory_slicer, writer_preprocessor,
                   episodes=episode_generator(), **kwargs)

    def close(self) -> None:
        """Detach (the creating process also removes the buffer, unless ``persist``).
        Steps not written yet (an episode not clipped) are dropped."""
        self._ebuf.close()

    def __repr__(self) -> str:
        return (f"<shmbuf.compat.d3rlpy.ReplayBuffer {self.name!r} {self.transition_count} transitions, "
                f"{self.size()} episodes>")


def _action_space(value: int) -> Any:
    d3 = d3rlpy_module()
    if d3 is not None:
        from d3rlpy.constants import ActionSpace as D3ActionSpace
        return D3ActionSpace(value)
    return ActionSpace(value)


def create_fifo_replay_buffer(limit: int, episodes: Optional[Sequence[Any]] = None, **kwargs: Any) -> ReplayBuffer:
    """``ReplayBuffer(FIFOBuffer(limit), episodes=episodes, ...)``."""
    return ReplayBuffer(FIFOBuffer(limit), episodes=episodes, **kwargs)


def create_infinite_replay_buffer(episodes: Optional[Sequence[Any]] = None, **kwargs: Any) -> ReplayBuffer:
    """``ReplayBuffer(InfiniteBuffer(), episodes=episodes, ...)``."""
    return ReplayBuffer(InfiniteBuffer(), episodes=episodes, **kwargs)


