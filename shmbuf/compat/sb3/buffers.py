"""stable-baselines3's ``ReplayBuffer`` and ``DictReplayBuffer`` in shared memory: the
implementation of :mod:`shmbuf.compat.sb3` (import them from there; its documentation
says what changes from SB3's own).
"""

from __future__ import annotations

import multiprocessing.context
import os
import weakref
from typing import Any

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common import buffers as sb3
from stable_baselines3.common.preprocessing import get_action_dim, get_obs_shape
from stable_baselines3.common.type_aliases import DictReplayBufferSamples, ReplayBufferSamples
from stable_baselines3.common.utils import get_device

from shmbuf.buffer.handle import Buffer
from shmbuf.core.claims import NoFreeLane
from shmbuf.episodes import EpisodeBuffer
from shmbuf.episodes.rows import TERMINATED, TRUNCATED
from shmbuf.compat.sb3 import draws, newest
from shmbuf.compat.sb3.spaces import bad_obs, bad_shapes, space_from_json, space_to_json

KIND = "sb3.replay"
OBS, NEXT = "observations", "next_observations"
SB3ReplayBuffer, SB3DictReplayBuffer = sb3.ReplayBuffer, sb3.DictReplayBuffer  # (SB3's own, kept)


class ReplayBuffer(SB3ReplayBuffer):
    """SB3's ``ReplayBuffer`` in shared memory (see the module's documentation).

    ``name``: the buffer's name (default: a new one); ``seed``: this handle's sampling
    RNG (default: numpy's global one, drawn exactly as SB3 draws (``draws.py``): the same
    seed gives the same batches as SB3's buffer; with ``optimize_memory_usage``, one
    seed drawn from it); ``lanes``: lanes in all (default ``n_envs``; more
    leave room for the envs of other processes: ``buffer_size`` rows in all, split
    evenly); ``rate``: a :class:`shmbuf.RateLimit` on every handle's adds and samples;
    ``timeout``: seconds any blocking call waits at most."""

    _core: Any = None
    _newest_at_once = True  # optimize_memory_usage: the newest steps sampled at once (newest.py)

    def __init__(self, buffer_size: int, observation_space: spaces.Space, action_space: spaces.Space,
                 device: th.device | str = "auto", n_envs: int = 1, optimize_memory_usage: bool = False,
                 handle_timeout_termination: bool = True, *, name: str | None = None, seed: Any = None,
                 lanes: int | None = None, rate: Any = None, timeout: float = 10.0) -> None:
        self._setup(observation_space, action_space, device, n_envs, optimize_memory_usage,
                    handle_timeout_termination)
        if not isinstance(buffer_size, (int, np.integer)) or isinstance(buffer_size, bool) or buffer_size < 1:
            raise ValueError(f"buffer_size must be an int >= 1, got {buffer_size!r}")
        lanes = self.n_envs if lanes is None else lanes
        if isinstance(lanes, bool) or not isinstance(lanes, (int, np.integer)) or lanes < self.n_envs:
            raise ValueError(f"lanes must be an int >= n_envs ({self.n_envs}): one lane per env, got {lanes!r}")
        self.buffer_size = max(int(buffer_size) // int(lanes), 1)  # rows per lane (SB3's: per env)
        meta = {"kind": KIND, "observation_space": space_to_json(observation_space),
                "action_space": space_to_json(action_space), "optimize_memory_usage": self.optimize_memory_usage,
                "handle_timeout_termination": self.handle_timeout_termination, "sb3": KIND}  # (an EpisodeBuffer's kind: "episodes")
        fields, her = self._fields(), self._relabelling()
        self._episodic = meta["episodic"] = self.optimize_memory_usage or her is not None
        if seed is None and self._episodic:  # (from numpy's global RNG, which SB3's seed= seeds: runs repeat)
            seed = int(np.random.randint(2 ** 31))
        self._draws: Any = seed is None  # (batches drawn as SB3 draws them: draws.py; made in _open)
        if self._episodic:
            core = EpisodeBuffer.create(fields, self.buffer_size * int(lanes), lanes=int(lanes), name=name,
                                        seed=seed, timeout=timeout, observations=self._obs_names(OBS), reward="rewards",
                                        _library=meta, her=her, rate=rate, _regions=newest.regions(
                                            fields, self._obs_names(OBS), int(lanes), her is None and self._newest_at_once))
        else:
            fields.update({k.replace(OBS, NEXT, 1): v for k, v in fields.items() if k.startswith(OBS)})
            fields.update(dones=((), np.float32), timeouts=((), np.float32))
            core = Buffer.create(fields, self.buffer_size * int(lanes), lanes=int(lanes), name=name, seed=seed,
                                 timeout=timeout, _library=meta, rate=rate)
        self._open(core)

    def _setup(self, observation_space: spaces.Space, action_space: spaces.Space, device: Any, n_envs: int,
               optimize_memory_usage: bool, handle_timeout_termination: bool) -> None:
        """What SB3's constructors set, less its arrays."""
        if isinstance(n_envs, bool) or not isinstance(n_envs, (int, np.integer)) or n_envs < 1:
            raise ValueError(f"n_envs must be an int >= 1, got {n_envs!r}")
        if isinstance(observation_space, spaces.Dict) != isinstance(self, SB3DictReplayBuffer):
            raise TypeError(f"{type(self).__name__} takes {'a' if isinstance(self, DictReplayBuffer) else 'no'} "
                            f"Dict observation space, got {observation_space!r:.200}; use "
                            f"{'ReplayBuffer' if isinstance(self, DictReplayBuffer) else 'DictReplayBuffer'}")
        self.observation_space, self.action_space = observation_space, action_space
        self.obs_shape = get_obs_shape(observation_space)
        self.action_dim = get_action_dim(action_space)
        self.device = get_device(device)
        self.n_envs = int(n_envs)
        self.optimize_memory_usage = bool(optimize_memory_usage)
        self.handle_timeout_termination = bool(handle_timeout_termination)

    def _relabelling(self) -> Any:
        """The hindsight relabelling of this handle's samples (HerReplayBuffer's), or None."""
        return None

    def _obs_names(self, prefix: str) -> list[str]:
        return [prefix] if not isinstance(self.obs_shape, dict) else [f"{prefix}.{k}" for k in self.obs_shape]

    def _fields(self) -> dict[str, Any]:
        shapes = self.obs_shape if isinstance(self.obs_shape, dict) else {None: self.obs_shape}
        dtypes = ({k: s.dtype for k, s in self.observation_space.spaces.items()}
                  if isinstance(self.obs_shape, dict) else {None: self.observation_space.dtype})
        fields = {OBS if k is None else f"{OBS}.{k}": (tuple(shape), dtypes[k]) for k, shape in shapes.items()}
        fields["actions"] = ((self.action_dim,), self._maybe_cast_dtype(self.action_space.dtype))
        fields["rewards"] = ((), np.float32)
        return fields

    def _open(self, core: Any) -> None:
        self._core = core
        self._draws, self._newest = (draws.Draws(core.engine) if self._draws and not self._episodic else None), newest.part(core)
        # the common case's shapes (rows of one flat observation), or None: add's fast path
        self._flat = None if self._episodic or isinstance(self.obs_shape, dict) else \
            ((self.n_envs, *self.obs_shape), (self.n_envs, self.action_dim), (0.0,) if self.n_envs == 1 else np.zeros(self.n_envs, np.float32))
        self._lanes: list[int] = []  # the lanes this handle's envs write (claimed at the first add)
        self._writer: Any = None  # episodes: the episode writer of this handle's envs
        self._next: Any = None  # ... and the next observations of its last add (a reset shows)
        _handles.add(self)

    def forked(self) -> None:
        """In a forked child: the lanes (and episode writer) are the parent's; it claims its own."""
        self._lanes, self._writer, self._next = [], None, None

    @classmethod
    def attach(cls, name: str, *, device: th.device | str = "auto", n_envs: int = 1, seed: Any = None,
               timeout: float = 10.0) -> "ReplayBuffer":
        """Attach to the buffer ``name`` (any process; ``n_envs``: the envs this handle
        adds, each claiming a free lane at its first ``add``), with its creator's
        ``optimize_memory_usage`` and ``handle_timeout_termination``. A HER buffer is
        attached as a ``DictReplayBuffer`` of its episodes (its samples not relabelled:
        ``compute_reward`` is the creator's env's).

        Examples:
            >>> from gymnasium import spaces
            >>> rb = ReplayBuffer(8, spaces.Box(-1, 1, (2,)), spaces.Box(-1, 1, (1,)))
            >>> other = ReplayBuffer.attach(rb.name)  # e.g. in an actor process
            >>> other.buffer_size, other.n_envs, type(other.action_space).__name__
            (8, 1, 'Box')
            >>> other.close(); rb.close()
        """
        core = Buffer.attach(name, seed=seed, timeout=timeout)
        meta = core.engine.layout.meta
        try:
            if KIND not in (meta.get("kind"), meta.get("sb3")):
                raise ValueError(f"buffer {name!r} is not an SB3 replay buffer (it holds {meta.get('kind')!r})")
            obs_space, act_space = space_from_json(meta["observation_space"]), space_from_json(meta["action_space"])
            kind = DictReplayBuffer if isinstance(obs_space, spaces.Dict) else ReplayBuffer
            self = kind.__new__(kind)
            self._setup(obs_space, act_space, device, n_envs, meta["optimize_memory_usage"], meta["handle_timeout_termination"])
            self._episodic = meta["episodic"]
            if self.n_envs > core.lanes:
                raise ValueError(f"n_envs={n_envs} envs need as many lanes, and buffer {name!r} has {core.lanes}")
            self.buffer_size, self._draws = core.capacity // core.lanes, seed is None and not self._episodic
            self._open(EpisodeBuffer(core) if self._episodic else core)
            return self
        except BaseException:
            core.close()
            raise

    # -- adding ----------------------------------------------------------------------

    def add(self, obs: Any, next_obs: Any, action: np.ndarray, reward: np.ndarray, done: np.ndarray,
            infos: list[dict[str, Any]], *, timeout: float | None = None) -> None:
        """One step of each of the ``n_envs`` envs (SB3's ``add``): ``infos[i]
        ["TimeLimit.truncated"]`` marks a time limit (a timeout, never a terminal state,
        with ``handle_timeout_termination``). ``timeout``: seconds to wait at most for
        a rate limit (then ``shmbuf.RateLimitTimeout``, nothing added)."""
        flat, n = self._flat, self.n_envs
        if flat is not None:  # flat observations, no episodes: the fewest calls, as it runs every env step
            rows, act_rows, timeouts = flat
            try:  # (arrays as SB3's callers pass them; anything else takes the checked path)
                o, nxt, a, r, d = obs.reshape(rows), next_obs.reshape(rows), action.reshape(act_rows), reward.reshape(n), done.reshape(n)
            except (ValueError, AttributeError, TypeError):
                pass  # (the checked path below converts, or says what was wrong)
            else:
                if self.handle_timeout_termination:
                    timeouts = self._timeouts(infos)
                lanes = self._lanes or self._claimed()
                if n == 1:
                    self._core.add({OBS: o[0], NEXT: nxt[0], "actions": a[0], "rewards": r[0], "dones": d[0],
                                    "timeouts": timeouts[0]}, lane=lanes[0], timeout=timeout)
                else:  # each env into its own lane, in one call
                    self._core.add_each({OBS: o, NEXT: nxt, "actions": a, "rewards": r, "dones": d,
                                         "timeouts": np.asarray(timeouts, np.float32)}, self._lane_array, timeout=timeout)
                return
        wait = timeout
        try:
            action = np.asarray(action).reshape((n, self.action_dim))
            reward = np.asarray(reward).reshape(n)
            done = np.asarray(done).reshape(n)
        except ValueError:
            raise ValueError(bad_shapes(n, self.action_dim, action, reward, done)) from None
        timeout = self._timeouts(infos) if self.handle_timeout_termination else [0.0] * n
        obs, next_obs = self._by_env(obs, OBS), self._by_env(next_obs, NEXT)
        if self._episodic:
            return self._add_steps(obs, next_obs, action, reward, done.astype(bool), np.array(timeout, bool), wait)
        self._core.add_each({**obs, **next_obs, "actions": action, "rewards": reward, "dones": done,  # (env i: lane i)
                             "timeouts": np.asarray(timeout, np.float32)}, self._lanes or self._claimed(), timeout=wait)

    def _timeouts(self, infos: Any) -> list[float]:
        """Each env's time limit, from ``infos[i]["TimeLimit.truncated"]`` (read only with
        ``handle_timeout_termination``, as SB3 does: CleanRL passes a dict)."""
        if not isinstance(infos, (list, tuple)) or len(infos) != self.n_envs:
            raise ValueError(f"expected a list of infos, one per env ({self.n_envs}), to find time limits in "
                             f"(handle_timeout_termination=True), got {type(infos).__name__} of {len(infos)}")
        return [float(bool(info.get("TimeLimit.truncated", False))) for info in infos]

    def _by_env(self, value: Any, prefix: str) -> dict[str, np.ndarray]:
        """Observations as ``{field: (n_envs, *shape)}``."""
        n = self.n_envs
        arg = "obs" if prefix == OBS else "next_obs"
        if isinstance(self.obs_shape, dict):
            if not isinstance(value, dict) or set(value) != set(self.obs_shape):
                raise ValueError(f"{arg}: expected observations with keys {sorted(self.obs_shape)}, got "
                                 f"{sorted(value) if isinstance(value, dict) else type(value).__name__}")
            out = {}
            for k, v in value.items():
                rows = (n, *self.obs_shape[k])
                try:
                    out[f"{prefix}.{k}"] = np.asarray(v).reshape(rows)
                except ValueError:
                    raise ValueError(bad_obs(f"{arg}[{k!r}]", v, rows)) from None
            return out
        rows = (n, *self.obs_shape)
        try:
            return {prefix: np.asarray(value).reshape(rows)}
        except ValueError:
            raise ValueError(bad_obs(arg, value, rows) or f"{arg} must be {rows}, got {value!r:.100}") from None

    def _claimed(self) -> list[int]:
        if not self._lanes:
            self._lanes = self._lanes_for(lambda: self._core.engine.ring.claim_many(self.n_envs, self._core.timeout))
            self._lane_array = np.array(self._lanes, np.int64)
        return self._lanes

    def _lanes_for(self, claim: Any) -> Any:
        """``claim()`` (this handle's envs' lanes), with the facade's advice if none are free."""
        try:
            return claim()
        except NoFreeLane:
            lanes = self._plain().lanes
            raise RuntimeError(f"this handle's {self.n_envs} env(s) need a lane each, and all {lanes} lanes of "
                               f"buffer {self.name!r} are claimed by live processes (one per env of every "
                               "process that adds). Make the buffer with more: ReplayBuffer(..., lanes=N); or "
                               "close() a handle that is done adding") from None

    def _add_steps(self, obs: dict, next_obs: dict, action: np.ndarray, reward: np.ndarray,
                   done: np.ndarray, timeout: np.ndarray, wait: float | None) -> None:
        """Episodes (optimize_memory_usage, HER): one step per env into an episode writer."""
        if self._writer is None:
            self._writer = self._lanes_for(lambda: self._core.writer(envs=self.n_envs))
        elif any(not np.array_equal(obs[k][~self._ended], self._next[k][~self._ended]) for k in obs):
            self._writer.close()  # an env was reset since the last add (a new learn()): the steps
            self._writer = self._core.writer(envs=self.n_envs)  # before have no next observation
        step = {**obs, **next_obs, "actions": action, "rewards": reward}
        self._writer.add(step, terminated=done & ~timeout, truncated=done & timeout, timeout=wait)
        self._newest.put(self._writer.lanes, step, done)  # (the step's next observation: newest.py)
        self._next = {k.replace(NEXT, OBS, 1): np.array(v) for k, v in next_obs.items()}
        self._ended = done  # (an env that ended starts its next step from a reset: not compared)

    # -- sampling --------------------------------------------------------------------

    def sample(self, batch_size: int, env: Any = None, *, timeout: float | None = None) -> Any:
        """``batch_size`` transitions, uniformly over every env's rows (drawn as SB3 draws
        them without ``seed=``), as SB3's ``ReplayBufferSamples`` of tensors on ``device``:
        ``dones`` and ``rewards`` ``(batch_size, 1)`` float32; ``env`` (a ``VecNormalize``)
        normalizes observations and rewards. ``timeout``: seconds a rate limit may take."""
        core = self._core
        b = core.engine.read(self._draws, batch_size, batch_size, timeout) if self._draws else \
            self._newest.sample(core, batch_size, timeout)  # (newest.py: with the newest steps, or core.sample)
        if self._episodic:
            ended = b["terminated"] if self.handle_timeout_termination else b["terminated"] | b["truncated"]
            dones = ended.astype(np.float32)
        else:
            dones = b["dones"] * (1 - b["timeouts"])
        obs, next_obs = self._obs_out(b, OBS, env), self._obs_out(b, NEXT, env)
        rewards = self._normalize_reward(b["rewards"].reshape(-1, 1), env)
        return self._samples(obs, b["actions"], next_obs, dones.reshape(-1, 1), rewards)

    def _obs_out(self, batch: dict, prefix: str, env: Any) -> Any:
        if isinstance(self.obs_shape, dict):
            return self._normalize_obs({k: batch[f"{prefix}.{k}"] for k in self.obs_shape}, env)
        return self._normalize_obs(batch[prefix], env)

    def _samples(self, obs: Any, actions: np.ndarray, next_obs: Any, dones: np.ndarray, rewards: np.ndarray) -> Any:
        t = self._tensor
        return ReplayBufferSamples(t(obs), t(actions), t(next_obs), t(dones), t(rewards))

    def _tensor(self, a: Any) -> Any:
        if isinstance(a, dict):
            return {k: self._tensor(v) for k, v in a.items()}
        if self.device.type == "cpu" and a.flags.c_contiguous and a.flags.writeable:
            return th.from_numpy(a)  # (a fresh array of this batch's: no copy)
        return th.as_tensor(np.ascontiguousarray(a)).to(self.device)

    # -- SB3's state -----------------------------------------------------------------

    def size(self) -> int:
        """Transitions per env (SB3's count: ``buffer_size`` once full; with
        ``optimize_memory_usage`` or HER, the steps stored: episodes' final observations
        take rows of their own, so it stays below ``buffer_size`` once the ring wrapped)."""
        if self._episodic:
            return sum(self._core.lane_steps()) // self._plain().lanes
        return len(self._core) // self._plain().lanes

    @property
    def total_added(self) -> int:
        """Rows added by every process since the buffer was made (an actor's step count)."""
        return self._plain().total_added

    def reset(self) -> None:
        """Empty the buffer (every process's view of it)."""
        self._plain().clear()

    @property
    def pos(self) -> int:
        """The row the first lane writes next (SB3's ``pos``, as the views index rows:
        ``dones[pos - 1]`` is the newest; with ``optimize_memory_usage`` or HER,
        episodes' final observations take rows of their own, so it runs ahead of
        :meth:`size`, which counts transitions)."""
        return int(self._plain().engine.heads()[0]) % self.buffer_size

    @pos.setter
    def pos(self, value: int) -> None:
        raise AttributeError("pos is the shared ring's head: it cannot be set; reset() empties the buffer")

    @property
    def full(self) -> bool:
        """True while the first lane holds ``buffer_size`` rows (SB3's ``full``)."""
        return self._plain().lane_sizes()[0] >= self.buffer_size

    @full.setter
    def full(self, value: bool) -> None:
        raise AttributeError("full says whether the shared ring has wrapped around: it cannot be set (shmbuf "
                             "never samples rows that were not written)")

    def _plain(self) -> Buffer:
        return self._core.core if self._episodic else self._core

    def _view(self, field: str) -> np.ndarray:
        """Field ``field`` of every row as ``(buffer_size, lanes, *shape)``, read-only."""
        core = self._plain()
        a = core.engine.view(field)
        return a.reshape((core.lanes, self.buffer_size) + a.shape[1:]).swapaxes(0, 1)

    def _views(self, prefix: str) -> Any:
        if isinstance(self.obs_shape, dict):
            return {k: self._view(f"{prefix}.{k}") for k in self.obs_shape}
        return self._view(prefix)

    observations = property(lambda self: self._views(OBS), doc="The stored observations (read-only view).")
    actions = property(lambda self: self._view("actions"), doc="The stored actions (read-only view).")
    rewards = property(lambda self: self._view("rewards"), doc="The stored rewards (read-only view).")

    @property
    def next_observations(self) -> Any:
        """The stored next observations (read-only view; with ``optimize_memory_usage`` or
        HER a copy: each row's next row in its lane, where the episode's final
        observation follows its last step)."""
        if not self._episodic:
            return self._views(NEXT)
        obs = self._views(OBS)
        return {k: np.roll(v, -1, axis=0) for k, v in obs.items()} if isinstance(obs, dict) else np.roll(obs, -1, 0)

    @property
    def dones(self) -> np.ndarray:
        """The stored done flags (read-only view; a copy with ``optimize_memory_usage`` or HER)."""
        if self._episodic:
            return ((self._view("_flags") & (TERMINATED | TRUNCATED)) != 0).astype(np.float32)
        return self._view("dones")

    @property
    def timeouts(self) -> np.ndarray:
        """The stored timeout flags (read-only view; a copy with ``optimize_memory_usage`` or HER)."""
        if self._episodic:
            return ((self._view("_flags") & TRUNCATED) != 0).astype(np.float32)
        return self._view("timeouts")

    # -- lifetime --------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The buffer's name: ``ReplayBuffer.attach(name)`` from any process."""
        return self._core.name

    def _release(self) -> None:
        ring = self._plain().engine.ring
        while self._lanes:
            ring.release(self._lanes.pop(), 1.0)

    def close(self) -> None:
        """Give back this handle's lanes and detach (the creator's close removes the buffer)."""
        if self._core is None:
            return
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if not self._plain().closed:
            self._release()
        self._core.close()

    def __enter__(self) -> "ReplayBuffer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def config(self) -> dict[str, Any]:
        """The constructor's arguments that make a buffer like this one (but its size and spaces)."""
        return {"device": str(self.device), "n_envs": self.n_envs, "optimize_memory_usage": self.optimize_memory_usage,
                "handle_timeout_termination": self.handle_timeout_termination, "lanes": self._plain().lanes}

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        if multiprocessing.context.get_spawning_popen() is not None:  # to a process being started: by name
            return (_attach, (self.name, {"device": str(self.device), "n_envs": self.n_envs}))
        meta = self._plain().engine.layout.meta
        return (_restore, (type(self), self.buffer_size * self._plain().lanes, meta["observation_space"],
                           meta["action_space"], self.config(), self._plain().state_dict()))

    def __repr__(self) -> str:
        return (f"<shmbuf.compat.sb3.{type(self).__name__} {self.name!r} {self.size()}/{self.buffer_size} "
                f"rows x {self._plain().lanes} lanes, n_envs={self.n_envs}>")


class DictReplayBuffer(ReplayBuffer, SB3DictReplayBuffer):
    """SB3's ``DictReplayBuffer`` in shared memory: one field per key of the Dict
    observation space (``observations.<key>``, ``next_observations.<key>``)."""

    def _samples(self, obs: Any, actions: np.ndarray, next_obs: Any, dones: np.ndarray, rewards: np.ndarray) -> Any:
        t = self._tensor
        return DictReplayBufferSamples(t(obs), t(actions), t(next_obs), t(dones), t(rewards))


_handles: "weakref.WeakSet[ReplayBuffer]" = weakref.WeakSet()
os.register_at_fork(after_in_child=lambda: [h.forked() for h in list(_handles)])


def _attach(name: str, config: dict[str, Any]) -> ReplayBuffer:
    return ReplayBuffer.attach(name, **config)


def _restore(cls: type, buffer_size: int, obs_space: dict[str, Any], act_space: dict[str, Any],
             config: dict[str, Any], state: dict[str, Any]) -> ReplayBuffer:
    """A buffer pickled by value: a new one, of its own, holding the rows."""
    self = cls(buffer_size, space_from_json(obs_space), space_from_json(act_space), **config)
    self._plain().load_state_dict(state)
    return self
