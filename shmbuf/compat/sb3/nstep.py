"""SB3 2.9's ``NStepReplayBuffer`` in shared memory (``replay_buffer_class=NStepReplayBuffer``,
or what SB3's DQN, SAC and TD3 make with ``n_steps=k``).

Each sampled transition's ``rewards`` is the discounted sum of up to ``n_steps`` rewards of
its env, stopping at the episode's end (a terminal state or a time limit) and at the env's
newest step; ``next_observations`` is the observation after the last step taken, ``dones``
says whether a terminal state (not a time limit, with ``handle_timeout_termination``)
ended it, and ``discounts`` is ``gamma ** steps taken``, for the target's bootstrap: SB3's
semantics. The steps are kept as episodes per env (an :class:`shmbuf.EpisodeBuffer`, as
with ``optimize_memory_usage``), so a sum never joins two episodes or two envs, whatever
other processes write meanwhile, and each step's reward is read through the torn-read
check. Divergences: ``optimize_memory_usage=True`` is accepted (SB3 refuses it: here the
storage is the same); with a ``VecNormalize`` the sum is normalized, not each reward
before it (the same but where rewards are clipped); a handle attached by name samples
one-step transitions of the same rows (``EpisodeBuffer.attach(name).sample(n,
n_step=k, gamma=g)`` samples n-step ones from any process).

Examples:
    >>> import numpy as np
    >>> from gymnasium import spaces
    >>> rb = NStepReplayBuffer(100, spaces.Box(0, 1, (2,)), spaces.Box(0, 1, (1,)), "cpu", n_steps=3, gamma=0.5)
    >>> for t in range(4):  # rewards 1, 1, 1, 1; the episode ends (terminal) at step 3
    ...     rb.add(np.full((1, 2), t), np.full((1, 2), t + 1), np.zeros((1, 1)), np.array([1.0]),
    ...            np.array([t == 3]), [{}])
    >>> b = rb.sample(200)
    >>> sorted({(o, r, d, g) for o, r, d, g in zip(b.observations[:, 0].tolist(), b.rewards[:, 0].tolist(),
    ...                                           b.dones[:, 0].tolist(), b.discounts[:, 0].tolist())})
    [(0.0, 1.75, 0.0, 0.125), (1.0, 1.75, 1.0, 0.125), (2.0, 1.5, 1.0, 0.25), (3.0, 1.0, 1.0, 0.5)]
    >>> rb.close()
"""

from __future__ import annotations

from typing import Any

import numpy as np
from stable_baselines3.common.buffers import NStepReplayBuffer as SB3NStepReplayBuffer
from stable_baselines3.common.type_aliases import ReplayBufferSamples

from shmbuf.compat.sb3.buffers import NEXT, OBS, ReplayBuffer


class NStepReplayBuffer(ReplayBuffer, SB3NStepReplayBuffer):
    """SB3's ``NStepReplayBuffer`` (``n_steps``, ``gamma``) over shared memory; other
    arguments as :class:`shmbuf.compat.sb3.ReplayBuffer`'s. See the module."""

    _newest_at_once = False  # (its n-step windows stop at each env's newest row: see the module)

    def __init__(self, *args: Any, n_steps: int = 3, gamma: float = 0.99, **kwargs: Any) -> None:
        if isinstance(n_steps, bool) or not isinstance(n_steps, (int, np.integer)) or n_steps < 1:
            raise ValueError(f"n_steps must be an int >= 1, got {n_steps!r}")
        if isinstance(gamma, bool) or not isinstance(gamma, (int, float, np.floating)) or not 0 <= gamma <= 1:
            raise ValueError(f"gamma must be a number in [0, 1], got {gamma!r}")
        # the steps are kept as episodes (ReplayBuffer does so for optimize_memory_usage)
        memory = bool(kwargs.pop("optimize_memory_usage", args[5] if len(args) > 5 else False))
        args = args[:5] + (True,) + args[6:] if len(args) > 5 else args
        if len(args) <= 5:
            kwargs["optimize_memory_usage"] = True
        super().__init__(*args, **kwargs)
        self.optimize_memory_usage = memory  # (the caller's: config() and pickles keep it)
        self.n_steps, self.gamma = int(n_steps), float(gamma)

    def sample(self, batch_size: int, env: Any = None, *, timeout: float | None = None) -> ReplayBufferSamples:
        """``batch_size`` n-step transitions (see the module) as SB3's
        ``ReplayBufferSamples`` on ``device``, ``discounts`` included."""
        b = self._core.sample(batch_size, n_step=self.n_steps, gamma=self.gamma, timeout=timeout)
        ended = b["terminated"] if self.handle_timeout_termination else b["terminated"] | b["truncated"]
        obs, next_obs = self._obs_out(b, OBS, env), self._obs_out(b, NEXT, env)
        rewards = self._normalize_reward(b["rewards"].reshape(-1, 1), env)
        discounts = (self.gamma ** b["steps"].astype(np.float64)).astype(np.float32).reshape(-1, 1)
        t = self._tensor
        return ReplayBufferSamples(t(obs), t(b["actions"]), t(next_obs), t(ended.astype(np.float32).reshape(-1, 1)),
                                   t(rewards.astype(np.float32)), t(discounts))

    def config(self) -> dict[str, Any]:
        return {**super().config(), "n_steps": self.n_steps, "gamma": self.gamma}
