"""A small vectorised environment in numpy, for the demo and benchmarks (no gym needed)."""

from __future__ import annotations

import numpy as np


class CartPole:
    """The classic cart-pole task (Barto, Sutton & Anderson, 1983) for ``n`` envs at once.

    ``step(actions)`` returns ``(next_obs, reward, terminated, truncated)`` where
    ``next_obs`` is the observation the action led to; finished envs are reset
    afterwards, and :attr:`obs` is then the first observation of their next episode.

    Examples:
        >>> env = CartPole(3, seed=0)
        >>> nxt, r, term, trunc = env.step(np.array([0, 1, 1]))
        >>> nxt.shape, r.tolist(), env.obs.dtype
        ((3, 4), [1.0, 1.0, 1.0], dtype('float32'))
    """

    gravity, cart_mass, pole_mass, half_length, force, tau = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02
    x_limit, theta_limit, max_steps = 2.4, 12 * 2 * np.pi / 360, 500

    def __init__(self, n: int, seed: int | None = None) -> None:
        self.n = n
        self.rng = np.random.default_rng(seed)
        self.state = self.rng.uniform(-0.05, 0.05, (n, 4))
        self.steps = np.zeros(n, np.int64)

    @property
    def obs(self) -> np.ndarray:
        return self.state.astype(np.float32)

    @classmethod
    def dynamics(cls, state: np.ndarray, actions: np.ndarray) -> np.ndarray:
        """The state after ``actions`` (one per row of ``state``): Euler steps of the physics."""
        x, x_dot, theta, theta_dot = np.asarray(state, np.float64).T
        force = np.where(actions == 1, cls.force, -cls.force)
        total = cls.cart_mass + cls.pole_mass
        cos, sin = np.cos(theta), np.sin(theta)
        temp = (force + cls.pole_mass * cls.half_length * theta_dot**2 * sin) / total
        theta_acc = (cls.gravity * sin - cos * temp) / (
            cls.half_length * (4.0 / 3.0 - cls.pole_mass * cos**2 / total))
        x_acc = temp - cls.pole_mass * cls.half_length * theta_acc * cos / total
        return np.stack([x + cls.tau * x_dot, x_dot + cls.tau * x_acc,
                         theta + cls.tau * theta_dot, theta_dot + cls.tau * theta_acc], 1)

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        self.state = self.dynamics(self.state, actions)
        self.steps += 1
        next_obs = self.obs
        terminated = (np.abs(self.state[:, 0]) > self.x_limit) | (np.abs(self.state[:, 2]) > self.theta_limit)
        truncated = ~terminated & (self.steps >= self.max_steps)
        done = terminated | truncated
        if done.any():
            self.state[done] = self.rng.uniform(-0.05, 0.05, (int(done.sum()), 4))
            self.steps[done] = 0
        return next_obs, np.ones(self.n, np.float32), terminated, truncated
