"""Environment makers for TorchRL's collectors in tests (their worker processes import
them by name)."""

from __future__ import annotations


def cartpole():
    from torchrl.envs import GymEnv, StepCounter, TransformedEnv

    return TransformedEnv(GymEnv("CartPole-v1"), StepCounter())
