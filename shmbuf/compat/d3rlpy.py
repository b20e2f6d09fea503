"""d3rlpy's ``ReplayBuffer`` and its parts, over an :class:`shmbuf.EpisodeBuffer`.

Switch with one import::

    from shmbuf.compat.d3rlpy import (ReplayBuffer, FIFOBuffer, InfiniteBuffer, Signature, Episode,
        ActionSpace, BasicTransitionPicker, MultiStepTransitionPicker, FrameStackTransitionPicker,
        SparseRewardTransitionPicker, BasicTrajectorySlicer, MixedReplayBuffer)

``ReplayBuffer(buffer, transition_picker=None, trajectory_slicer=None, ..., episodes=None,
env=None, observation_signature=None, ...)`` works out its signatures as d3rlpy does and
owns an episode buffer in shared memory: ``FIFOBuffer(limit)`` gives it ``limit`` rows,
``InfiniteBuffer()`` as many as its ``episodes`` need or ``limit`` (default 1,000,000),
and an ``append`` past that raises (it never evicts). ``append(observation, action,
reward)`` / ``clip_episode(terminated)``, ``append_episode``, ``sample_transition_batch``
(float32, ``(B, 1)`` rewards, terminals and intervals; n-step and frame stacks by the
picker), ``sample_trajectory_batch`` (windows ending at a transition, front-padded, 1-based
timesteps, returns-to-go to the episode's end), ``size()`` (episodes), ``transition_count``,
``dump(f)`` / ``ReplayBuffer.load(f, buffer)`` in d3rlpy's HDF5 layout. Another process
attaches with ``ReplayBuffer.attach(name)`` and appends through its own lane (create with
``lanes=`` one per process that appends at the same time). Where d3rlpy is installed the
mini-batches, transitions, trajectories, episodes and ``dataset_info`` are d3rlpy's own
types, so its algorithms take the buffer (``algo.fit_online(env, buffer=...)``).

Divergences (README): a step becomes sampleable two appends after d3rlpy's (the handle
holds the newest two steps until it knows whether the episode ends there); ``clip_episode``
after one step gives one terminal transition or nothing; a FIFO's ``limit`` counts rows
(each episode's last observation takes one); ``episodes`` and ``dump`` hold the complete
episodes; mini-batches carry no ``transitions`` list (Cal-QL is not supported); the reward
of a cut episode's last step is not kept. Sampling uses the handle's own seeded generator.

Example:
    >>> import numpy as np
    >>> obs = Signature(dtype=[np.float32], shape=[(2,)])
    >>> buf = ReplayBuffer(FIFOBuffer(100), observation_signature=obs, seed=0,
    ...                    action_signature=Signature(dtype=[np.int64], shape=[(1,)]),
    ...                    reward_signature=Signature(dtype=[np.float32], shape=[(1,)]),
    ...                    action_space=ActionSpace.DISCRETE, action_size=2)
    >>> for t in range(3):
    ...     buf.append(np.full(2, t, np.float32), t % 2, 1.0)
    >>> buf.clip_episode(True)
    >>> buf.transition_count, buf.size()
    (3, 1)
    >>> b = buf.sample_transition_batch(4)
    >>> b.observations.shape, b.rewards.shape, b.terminals.dtype
    ((4, 2), (4, 1), dtype('float32'))
    >>> buf.close()
"""

from __future__ import annotations

import dataclasses
import importlib.util
from typing import Any, BinaryIO, Callable, Optional, Sequence

import numpy as np

from ..episodes import EpisodeBuffer
from .d3rlpy_types import (ActionSpace, BasicTrajectorySlicer, BasicTransitionPicker,  # noqa: F401
                           DatasetInfo, Episode, EpisodeGenerator, FIFOBuffer, FrameStackTransitionPicker,
                           InfiniteBuffer, MultiStepTransitionPicker, Signature, SparseRewardTransitionPicker,
                           TrajectoryMiniBatch, TransitionMiniBatch)
from .d3rlpy_dump import VERSION, dump_episodes, load_episodes  # noqa: F401
from .d3rlpy_mixed import MixedReplayBuffer  # noqa: F401
from .shared import Shared

DEFAULT_LIMIT = 1_000_000  # an InfiniteBuffer's rows when neither its episodes nor limit= say


def _limit(buffer: Any) -> tuple[str, Optional[int]]:
    """("fifo" or "infinite", rows) of ours or d3rlpy's buffer object."""
    kind = type(buffer).__name__
    limit = getattr(buffer, "limit", getattr(buffer, "_limit", None))
    if kind == "FIFOBuffer":
        return "fifo", int(limit)
    if kind == "InfiniteBuffer":
        return "infinite", limit
    raise TypeError(f"buffer must be a FIFOBuffer(limit) or an InfiniteBuffer(), got {kind}")


def _d3rlpy() -> Any:
    """d3rlpy's dataset module where d3rlpy is installed (imported on first use), else None."""
    global _D3
    if _D3 is None:
        _D3 = False
        if importlib.util.find_spec("d3rlpy") is not None:
            import d3rlpy.dataset
            _D3 = d3rlpy.dataset
    return _D3 or None


_D3: Any = None


def _signature_from_env(space: Any, action: bool) -> Signature:
    shape = tuple(space.shape)
    return Signature(dtype=[np.dtype(space.dtype)], shape=[shape if shape or not action else (1,)])


class ReplayBuffer(Shared):
    """d3rlpy's ``ReplayBuffer`` over an episode buffer in shared memory (see the module)."""

    def __init__(self, buffer: Any, transition_picker: Any = None, trajectory_slicer: Any = None,
                 writer_preprocessor: Any = None, episodes: Optional[Sequence[Any]] = None, env: Any = None,
                 observation_signature: Optional[Signature] = None, action_signature: Optional[Signature] = None,
                 reward_signature: Optional[Signature] = None, action_space: Any = None,
                 action_size: Optional[int] = None, cache_size: int = 10000, write_at_termination: bool = False,
                 *, name: Optional[str] = None, seed: Any = None, persist: bool = False, lanes: int = 1) -> None:
        episodes = list(episodes) if episodes else []
        if not (observation_signature and action_signature and reward_signature):
            if episodes:
                observation_signature = episodes[0].observation_signature
                action_signature = episodes[0].action_signature
                reward_signature = episodes[0].reward_signature
            elif env is not None:
                observation_signature = _signature_from_env(env.observation_space, False)
                action_signature = _signature_from_env(env.action_space, True)
                reward_signature = Signature(dtype=[np.dtype(np.float32)], shape=[[1]])
            else:
                raise ValueError("Either episodes or env must be provided to determine signatures. "
                                 "Or specify signatures directly.")
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
        kind, limit = _limit(buffer)
        picker = transition_picker or BasicTransitionPicker()
        config = {"obs": [[list(map(int, s)), np.dtype(d).str] for s, d in
                          zip(observation_signature.shape, observation_signature.dtype)],
                  "action": [list(map(int, action_signature.shape[0])) or [1], np.dtype(action_signature.dtype[0]).str],
                  "reward": [list(map(int, reward_signature.shape[0])), np.dtype(reward_signature.dtype[0]).str],
                  "action_space": int(action_space), "action_size": int(action_size), "kind": kind,
                  "n_steps": int(picker.n_steps), "gamma": float(picker.gamma)}
        if config["reward"][0] not in ([], [1]):
            raise ValueError(f"reward_signature shape {reward_signature.shape[0]}: this facade stores one reward "
                             "per step (shape (1,))")
        if limit is None:
            limit = max(sum(len(e.actions) + 1 for e in episodes), DEFAULT_LIMIT)
        fields = {f"observation_{j}" if len(config["obs"]) > 1 else "observation": (tuple(s), d)
                  for j, (s, d) in enumerate(config["obs"])}
        observations = [*fields, "action"]  # (next_action: the next row's, as an observation's)
        fields.update(action=(tuple(config["action"][0]), config["action"][1]), reward=((), config["reward"][1]))
        ebuf = EpisodeBuffer.create(fields, int(limit) * lanes, lanes=lanes, observations=observations,
                                    frame_stack=int(picker.n_frames), name=name, seed=seed, persist=persist,
                                    meta={"d3rlpy": config})
        self._open(ebuf, transition_picker, trajectory_slicer, writer_preprocessor, cache_size,
                   write_at_termination)
        self._or_remove(lambda: [self.append_episode(e) for e in episodes])

    def _open(self, ebuf: EpisodeBuffer, picker: Any, slicer: Any, preprocessor: Any, cache_size: int,
              write_at_termination: bool) -> None:
        config = ebuf.core.meta["d3rlpy"]
        self._ebuf, self._config = ebuf, config
        self._core = ebuf.core
        self._transition_picker = picker or BasicTransitionPicker()
        self._trajectory_slicer = slicer or BasicTrajectorySlicer()
        self._preprocessor = preprocessor
        self._cache_size, self._write_at_termination = int(cache_size), bool(write_at_termination)
        self._obs = [o for o in ebuf.observations if o != "action"]
        self._tuple = len(self._obs) > 1
        self._pending: list[dict[str, np.ndarray]] = []  # steps not written yet
        self._steps = 0  # steps of the active episode

    @classmethod
    def attach(cls, name: str, *, seed: Any = None, cache_size: int = 10000,
               write_at_termination: bool = False) -> "ReplayBuffer":
        """This buffer from another process, by name: its signatures and picker come with
        it; ``append`` there writes into a lane of its own."""
        ebuf = EpisodeBuffer.attach(name, seed=seed)
        config = ebuf.core.meta.get("d3rlpy")
        if config is None:
            ebuf.close()
            raise ValueError(f"buffer {name!r} was not made by shmbuf.compat.d3rlpy.ReplayBuffer")
        self = cls.__new__(cls)
        picker = (FrameStackTransitionPicker(ebuf.frame_stack) if ebuf.frame_stack > 1 else
                  MultiStepTransitionPicker(config["n_steps"], config["gamma"]) if config["n_steps"] > 1 else None)
        self._open(ebuf, picker, None, None, cache_size, write_at_termination)
        return self

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
        """Append one step to the active episode (held until the next appends or
        :meth:`clip_episode` tell how the episode goes on)."""
        if self._steps >= self._cache_size:
            raise AssertionError("episode length exceeds cache_size.")
        self._pending.append(self._step(observation, action, reward))
        self._steps += 1
        if not self._write_at_termination and len(self._pending) > 2:
            self._room(1)
            self._ebuf.add(self._pending.pop(0), terminated=False, truncated=False)

    def clip_episode(self, terminated: bool) -> None:
        """End the active episode: ``terminated=True`` makes its last step a terminal
        transition (next observation zeros); ``False`` (a time limit) keeps its last
        observation as the next observation of the step before, not a transition."""
        steps, self._pending, count = self._pending, [], self._steps
        self._steps = 0
        if not steps:
            return
        zeros = {"next_" + k: np.zeros_like(v) for k, v in steps[-1].items() if k != "reward"}
        if not terminated:
            if len(steps) < 2 and count < 2:
                return  # one observation, no transition (d3rlpy merges it into the next episode)
            final = {"next_" + k: v for k, v in steps.pop().items() if k != "reward"}
        else:
            final = zeros
        if self._write_at_termination and len(steps) + 1 <= self._ebuf.lane_capacity:
            episode = {k: np.stack([s[k] for s in steps]) for k in steps[0]}
            self._room(len(steps) + 1)
            self._ebuf.add_episode({**episode, **final}, terminated=bool(terminated))
            return
        for i, step in enumerate(steps):
            last = i == len(steps) - 1
            self._room(1 + last)
            self._ebuf.add({**step, **(final if last else {})}, terminated=bool(terminated) and last,
                           truncated=not terminated and last)

    def append_episode(self, episode: Any) -> None:
        """Append a whole episode (ours or d3rlpy's): its ``transition_count``
        transitions become sampleable at once."""
        obs = episode.observations if self._tuple else [episode.observations]
        data = {o: np.asarray(v) for o, v in zip(self._obs, obs)}
        data["action"] = np.asarray(episode.actions).reshape((len(episode.actions),) + self._ebuf.fields["action"][0])
        data["reward"] = np.asarray(episode.rewards, np.float64).reshape(len(episode.actions))
        if episode.terminated:
            final = {"next_" + k: np.zeros_like(v[0]) for k, v in data.items() if k != "reward"}
        else:
            final = {"next_" + k: v[-1] for k, v in data.items() if k != "reward"}
            data = {k: v[:-1] for k, v in data.items()}
        steps = len(data["action"])
        if steps == 0:
            return
        self._room(steps + 1)
        if steps + 1 <= self._ebuf.lane_capacity:
            self._ebuf.add_episode({**data, **final}, terminated=bool(episode.terminated))
            return
        for i in range(steps):  # longer than the buffer: its newest steps stay
            last = i == steps - 1
            self._ebuf.add({**{k: v[i] for k, v in data.items()}, **(final if last else {})},
                           terminated=bool(episode.terminated) and last, truncated=not episode.terminated and last)

    def _room(self, rows: int) -> None:
        """An InfiniteBuffer never evicts: refuse rows that do not fit (before writing)."""
        if self._config["kind"] == "infinite":
            writer, sizes = self._ebuf.own_writer(), self._core.lane_sizes()
            lane = writer.lanes[0] if writer.lanes else int(np.argmin(sizes))
            if sizes[lane] + rows > self._ebuf.lane_capacity:
                raise ValueError(f"the InfiniteBuffer is full ({self._ebuf.lane_capacity} rows, and it never "
                                 "evicts): create it with InfiniteBuffer(limit=...) larger, or use FIFOBuffer(limit)")

    # -- sampling ----------------------------------------------------------------------------

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

    def sample_transition_batch(self, batch_size: int) -> Any:
        """``batch_size`` transitions, uniformly over those stored (episodes weighted by
        length), with the picker's n-step and frame stacks: a ``TransitionMiniBatch``."""
        b = self._ebuf.sample(batch_size, n_step=self._config["n_steps"], gamma=self._config["gamma"])
        stacked = self._ebuf.frame_stack > 1
        action, next_action = (b["action"][:, -1], b["next_action"][:, -1]) if stacked else (b["action"], b["next_action"])
        terminal = b["terminated"]  # (the next observation and action after it: zeros)
        fields = dict(observations=self._observations(b, "", None),
                      actions=action.astype(np.float32), rewards=b["reward"].astype(np.float32)[:, None],
                      next_observations=self._observations(b, "next_", terminal if stacked else None),
                      next_actions=next_action.astype(np.float32),
                      terminals=terminal.astype(np.float32)[:, None],
                      intervals=b.get("steps", np.ones(batch_size)).astype(np.float32)[:, None])
        d3 = _d3rlpy()
        return (d3.TransitionMiniBatch if d3 else TransitionMiniBatch)(**fields, transitions=[])

    def sample_transition(self) -> Any:
        """One transition (a d3rlpy ``Transition`` where d3rlpy is installed)."""
        b = self.sample_transition_batch(1)
        fields = dict(observation=_first(b.observations), action=b.actions[0], reward=b.rewards[0],
                      next_observation=_first(b.next_observations), next_action=b.next_actions[0],
                      terminal=float(b.terminals[0, 0]), interval=int(b.intervals[0, 0]),
                      rewards_to_go=b.rewards[:1])
        d3 = _d3rlpy()
        return d3.Transition(**fields) if d3 else fields

    def sample_trajectory_batch(self, batch_size: int, length: int) -> Any:
        """``batch_size`` windows of ``length`` steps ending at a transition drawn
        uniformly: a ``TrajectoryMiniBatch`` of ``(B, L, ...)`` float32 arrays."""
        t = self._ebuf.sample_trajectories(batch_size, length)
        obs = [t[o].astype(np.float32) for o in self._obs]
        fields = dict(observations=obs if self._tuple else obs[0], actions=t["action"].astype(np.float32),
                      rewards=t["reward"].astype(np.float32)[..., None],
                      returns_to_go=t["returns_to_go"].astype(np.float32)[..., None],
                      terminals=t["terminated"].astype(np.float32)[..., None],
                      timesteps=t["timestep"].astype(np.float32), masks=t["mask"].astype(np.float32),
                      length=int(length))
        d3 = _d3rlpy()
        return (d3.TrajectoryMiniBatch if d3 else TrajectoryMiniBatch)(**fields)

    def sample_trajectory(self, length: int) -> Any:
        """One window (a d3rlpy ``PartialTrajectory`` where d3rlpy is installed)."""
        b = self.sample_trajectory_batch(1, length)
        fields = dict(observations=_first(b.observations), actions=b.actions[0], rewards=b.rewards[0],
                      returns_to_go=b.returns_to_go[0], terminals=b.terminals[0],
                      timesteps=b.timesteps[0].astype(np.int64), masks=b.masks[0], length=int(length))
        d3 = _d3rlpy()
        return d3.PartialTrajectory(**fields) if d3 else fields

    # -- counts and episodes ----------------------------------------------------------------

    def size(self) -> int:
        """Episodes with a transition in the buffer (partly evicted and active ones too)."""
        return self._ebuf.num_episodes

    @property
    def transition_count(self) -> int:
        return self._ebuf.transition_count

    @property
    def episodes(self) -> list[Any]:
        """Copies of the complete episodes held (ended, no step evicted), oldest first."""
        d3 = _d3rlpy()
        cls = d3.Episode if d3 else Episode
        out = []
        for ep in self._ebuf.episodes():
            obs = [ep[o] for o in self._obs]
            actions, rewards = ep["action"], ep["reward"].astype(np.float32)[:, None]
            terminated = bool(ep["terminated"][-1])
            if not terminated:  # the last observation, kept as the bootstrap one
                obs = [np.concatenate([a, ep["next_" + o][-1:]]) for a, o in zip(obs, self._obs)]
                actions = np.concatenate([actions, ep["next_action"][-1:]])
                rewards = np.concatenate([rewards, np.zeros((1, 1), np.float32)])
            out.append(cls(observations=obs if self._tuple else obs[0], actions=actions, rewards=rewards,
                           terminated=terminated))
        return out

    @property
    def dataset_info(self) -> Any:
        """Signatures, action space and size (d3rlpy's ``DatasetInfo`` where installed)."""
        c = self._config
        d3 = _d3rlpy()
        sig = d3.Signature if d3 else Signature
        info = dict(observation_signature=sig(dtype=[np.dtype(d) for _, d in c["obs"]],
                                              shape=[tuple(s) for s, _ in c["obs"]]),
                    action_signature=sig(dtype=[np.dtype(c["action"][1])], shape=[tuple(c["action"][0])]),
                    reward_signature=sig(dtype=[np.dtype(c["reward"][1])], shape=[tuple(c["reward"][0])]),
                    action_space=_action_space(c["action_space"]), action_size=c["action_size"])
        return (d3.DatasetInfo if d3 else DatasetInfo)(**info)

    @property
    def buffer(self) -> Any:
        return (FIFOBuffer(self._ebuf.lane_capacity) if self._config["kind"] == "fifo"
                else InfiniteBuffer(self._ebuf.lane_capacity))

    @property
    def transition_picker(self) -> Any:
        return self._transition_picker

    @property
    def trajectory_slicer(self) -> Any:
        return self._trajectory_slicer

    # -- files ------------------------------------------------------------------------------

    def dump(self, f: BinaryIO) -> None:
        """Write the complete episodes in d3rlpy's HDF5 layout (version 2.1; h5py)."""
        episodes = self.episodes
        if not episodes:
            raise IndexError("no complete episode to dump")
        dump_episodes(episodes, f)

    @classmethod
    def load(cls, f: BinaryIO, buffer: Any, episode_cls: type = Episode, transition_picker: Any = None,
             trajectory_slicer: Any = None, writer_preprocessor: Any = None, **kwargs: Any) -> "ReplayBuffer":
        """A new buffer over ``buffer`` holding the episodes of a :meth:`dump` file."""
        return cls(buffer, transition_picker, trajectory_slicer, writer_preprocessor,
                   episodes=load_episodes(f, episode_cls), **kwargs)

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


def _first(x: Any) -> Any:
    return [a[0] for a in x] if isinstance(x, list) else x[0]


def _action_space(value: int) -> Any:
    d3 = _d3rlpy()
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


