"""A pytest plugin that runs stable-baselines3's own tests with shmbuf's facade in
place of SB3's replay buffers (``scripts/test-libraries``: ``-p sb3_facade``).

SB3's tests import ``ReplayBuffer`` / ``DictReplayBuffer`` from
``stable_baselines3.common.buffers`` (``HerReplayBuffer`` from ``stable_baselines3``)
and its algorithms make theirs in ``stable_baselines3.common.off_policy_algorithm``:
every such name (``NStepReplayBuffer`` too) is bound to :mod:`shmbuf.compat.sb3`'s (``sb3.her``'s) classes before any test module is imported, so every
replay buffer those tests make, directly or through DQN, SAC, TD3 and DDPG, is a
shared-memory one. A test records which class it got, so a run proves the swap.
"""

from __future__ import annotations

import pytest

import library_namespace


def pytest_configure(config: pytest.Config) -> None:
    # a namespace of this run's own: the buffers SB3's tests make are this run's alone,
    # and any of them left at the end fails the run (see pytest_sessionfinish)
    library_namespace.enter("sb3")
    import stable_baselines3
    from stable_baselines3 import her
    from stable_baselines3.common import buffers, off_policy_algorithm
    from stable_baselines3.her import her_replay_buffer

    from shmbuf.compat import sb3
    from shmbuf.compat.sb3 import her as sb3_her

    for module in (buffers, off_policy_algorithm):
        module.ReplayBuffer = sb3.ReplayBuffer
        module.DictReplayBuffer = sb3.DictReplayBuffer
        module.NStepReplayBuffer = sb3.NStepReplayBuffer
    for module in (stable_baselines3, her, her_replay_buffer, off_policy_algorithm):
        module.HerReplayBuffer = sb3_her.HerReplayBuffer
    config.addinivalue_line("markers", "sb3_facade: run with shmbuf's SB3 facade")


def pytest_report_header(config: pytest.Config) -> str:
    return "sb3_facade: stable_baselines3's ReplayBuffer, DictReplayBuffer and HerReplayBuffer are shmbuf's"


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    library_namespace.check(session, "sb3")
