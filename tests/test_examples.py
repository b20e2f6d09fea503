"""The worked examples in ``examples/`` that use queue mode, policy versions and
prioritized sequences, run in a short form: they start their actor processes, move data through shmbuf and
make updates (learning itself is timed by hand: see docs/guides/actors.md)."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

pytest.importorskip("torch", reason="torch is an optional extra: pip install torch==2.13.0")
pytest.importorskip("gymnasium", reason="gymnasium is an optional extra")
pytestmark = pytest.mark.extras

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))


@pytest.mark.timeout(300)
def test_ppo_with_async_actors_takes_every_unroll_once():
    import ppo_queue

    got = ppo_queue.train(seconds=2.0, actors=2, max_lag=1)
    assert got["updates"] >= 1
    assert got["rows_taken"] == got["updates"] * ppo_queue.BATCH  # each take: one batch, nothing twice
    assert all(0 < r <= 500 for r in got["returns"])
    assert got["lag"].max() <= 1 and got["rows_stale"] >= 0  # (the lag limit: never more than 1 behind)


@pytest.mark.timeout(300)
def test_async_dqn_samples_only_recent_policy_rows():
    import dqn_recent

    args = {"seed": 1, "total_timesteps": 60000, "seconds": 0.0, "min_updates": 3, "learning_rate": 2.5e-4, "buffer_size": 4000,
            "gamma": 0.99, "target_network_frequency": 500, "batch_size": 32, "start_e": 1.0, "end_e": 0.05,
            "exploration_fraction": 0.5, "learning_starts": 300, "train_frequency": 10, "max_staleness": 5}
    got = dqn_recent.learn(args)
    assert got["updates"] >= 1 and got["staleness_max"] <= 5


@pytest.mark.timeout(300)
def test_r2d2_learner_trains_on_prioritized_sequences_with_burn_in():
    import r2d2_sequences

    got = r2d2_sequences.train(seconds=0.0, min_updates=3)
    assert got["updates"] == 3 and np.isfinite(got["losses"]).all() and got["episodes"] > 0
