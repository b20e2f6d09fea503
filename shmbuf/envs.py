"""A small vectorised environment in numpy, for the demo and benchmarks (no gym needed)."""

from __future__ import annotations

import numpy as np


class CartPole:
    """The classic cart-pole task (Barto, Sutton & Anderson, 1983) for ``n`` envs at once.

    ``step(actions)`` returns ``(next_obs, reward, terminated, truncated)`` where
    ``next_obs`` is the observation the action led to; finished envs are reset
    afterwards, and :attr:`obs` is then the first observation of their next episode.

    Example:
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

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        x, x_dot, theta, theta_dot = self.state.T
        force = np.where(actions == 1, self.force, -self.force)
        total = self.cart_mass + self.pole_mass
        cos, sin = np.cos(theta), np.sin(theta)
        temp = (force + self.pole_mass * self.half_length * theta_dot**2 * sin) / total
        theta_acc = (self.gravity * sin - cos * temp) / (
            self.half_length * (4.0 / 3.0 - self.pole_mass * cos**2 / total))
        x_acc = temp - self.pole_mass * self.half_length * theta_acc * cos / total
        self.state = np.stack([x + self.tau * x_dot, x_dot + self.tau * x_acc,
                               theta + self.tau * theta_dot, theta_dot + self.tau * theta_acc], 1)
        self.steps += 1
        next_obs = self.obs
        terminated = (np.abs(self.state[:, 0]) > self.x_limit) | (np.abs(self.state[:, 2]) > self.theta_limit)
        truncated = ~terminated & (self.steps >= self.max_steps)
        done = terminated | truncated
        if done.any():
            self.state[done] = self.rng.uniform(-0.05, 0.05, (int(done.sum()), 4))
            self.steps[done] = 0
        return next_obs, np.ones(self.n, np.float32), terminated, truncated
