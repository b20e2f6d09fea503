"""The worked examples in ``examples/`` that use queue mode, policy versions,
prioritized sequences and ragged rows, run in a short form: they start their actor
processes, move data through shmbuf and make updates (learning itself is timed by hand:
see docs/guides/actors.md)."""

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


@pytest.mark.timeout(300)
@pytest.mark.parametrize("use_torch", [True, False], ids=["torch-nested", "numpy-padded"])
def test_async_llm_rl_takes_token_budgets_and_verifies_every_token(use_torch):
    import async_llm_rl

    got = async_llm_rl.train(seconds=0.0, use_torch=use_torch, min_takes=3)  # (train checks every token it takes)
    assert got["torch"] is use_torch and got["takes"] >= 3 and got["rows_taken"] >= 3 and got["tokens"] > 0
    assert got["staleness"].max() <= async_llm_rl.MAX_STALENESS  # (the lag limit held)
    assert got["rows_taken"] + got["rows_stale"] <= got["rows_written"]


def test_async_llm_rl_check_finds_a_wrong_token():
    """The example's verification is not vacuous: one token changed fails it."""
    import async_llm_rl
    from shmbuf.ragged.jagged import Jagged

    rows = async_llm_rl.rollouts(1, np.arange(5, 9))
    batch = {k: Jagged.from_rows(v, dtype=async_llm_rl.FIELDS[k][1]) if isinstance(v, list) else v
             for k, v in rows.items()}
    assert async_llm_rl.check(batch) == len(batch["prompt"].values) + len(batch["response"].values)
    batch["response"].values[-1] += 1
    with pytest.raises(AssertionError, match="response: wrong tokens"):
        async_llm_rl.check(batch)


def test_async_llm_rl_advantages_are_per_group_and_refuse_a_split_group():
    """GRPO's advantages: each rollout's reward less its group's mean; a batch holding part
    of a group (what a take without groups=True can return) fails the check."""
    import async_llm_rl
    from shmbuf.ragged.jagged import Jagged

    k = async_llm_rl.PER_WRITE
    rows = async_llm_rl.rollouts(1, np.arange(0, 2 * k))
    batch = {n: Jagged.from_rows(v, dtype=async_llm_rl.FIELDS[n][1]) if isinstance(v, list) else v
             for n, v in rows.items()}
    assert (batch["prompt"][0] == batch["prompt"][k - 1]).all()  # one prompt per group
    adv = async_llm_rl.advantages(batch)
    for g in range(2):
        part = slice(g * k, (g + 1) * k)
        assert np.allclose(adv[part], batch["reward"][part] - batch["reward"][part].mean())
    with pytest.raises(AssertionError, match="a group split"):
        async_llm_rl.advantages({n: v[1:] for n, v in batch.items()})


@pytest.mark.timeout(300)
def test_async_llm_rl_prints_its_verification_and_leaves_nothing_after_ctrl_c():
    import signal
    import subprocess
    import time

    from shmbuf.core import segment

    script = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "async_llm_rl.py")
    res = subprocess.run([sys.executable, script, "--seconds", "0.5"], capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stderr
    assert "verified: every token, logprob and reward of" in res.stdout and "each taken once, in order" in res.stdout
    assert "torch jagged nested tensors" in res.stdout
    # Ctrl-C (a SIGINT to the whole process group, as a terminal sends it) once the queue
    # and the weights exist: the generators stop, both segments are removed
    before = set(segment.list_names())
    p = subprocess.Popen([sys.executable, script, "--seconds", "600", "--no-torch"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        while len(set(segment.list_names()) - before) < 2 and p.poll() is None:
            time.sleep(0.01)
        os.killpg(p.pid, signal.SIGINT)
        out, _ = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 130 and "interrupted" in out
    assert not set(segment.list_names()) - before
    # its processes (generators, the resource tracker) end: within seconds, not at once
    deadline = time.monotonic() + 60
    while (left := [d for d in os.listdir("/proc") if d.isdigit() and _session(int(d)) == p.pid]) \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left, f"processes of the example still run: {left}"


def _session(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[3])  # (state, ppid, pgrp, session)
    except (OSError, ValueError, IndexError):
        return None
