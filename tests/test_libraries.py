"""The reference libraries themselves, driven with the facades (scripts/test-libraries
runs this in a virtualenv of its own per library: their pins conflict with each other)."""

from __future__ import annotations

import os
import pathlib

import numpy as np
import pytest

pytestmark = pytest.mark.libraries


def test_d3rlpy_fit_online_trains_dqn_from_the_facade_buffer(name, tmp_path, monkeypatch):
    d3rlpy = pytest.importorskip("d3rlpy")
    gymnasium = pytest.importorskip("gymnasium")
    from shmbuf.compat.d3rlpy import FIFOBuffer, ReplayBuffer

    monkeypatch.chdir(tmp_path)  # (d3rlpy writes its logs under the working directory)
    env = gymnasium.make("CartPole-v1")
    buf = ReplayBuffer(FIFOBuffer(10_000), env=env, name=name, seed=0)
    dqn = d3rlpy.algos.DQNConfig(batch_size=32, learning_rate=1e-3).create(device="cpu:0")
    seen = []
    original = buf.sample_transition_batch

    def sample(batch_size):
        batch = original(batch_size)
        seen.append(batch)
        return batch

    buf.sample_transition_batch = sample
    dqn.fit_online(env, buffer=buf, explorer=d3rlpy.algos.ConstantEpsilonGreedy(0.3), n_steps=400,
                   n_steps_per_epoch=200, update_start_step=100, show_progress=False,
                   logger_adapter=d3rlpy.logging.NoopAdapterFactory())
    assert seen and all(isinstance(b, d3rlpy.dataset.TransitionMiniBatch) for b in seen)
    assert buf.transition_count >= 390 and buf.size() > 0
    assert isinstance(buf.episodes[0], d3rlpy.dataset.Episode)
    info = buf.dataset_info
    assert isinstance(info, d3rlpy.dataset.DatasetInfo) and info.action_size == 2
    assert info.action_space == d3rlpy.constants.ActionSpace.DISCRETE
    # offline: the same buffer as a dataset, and another handle of it
    other = ReplayBuffer.attach(name)
    dqn.fit(other, n_steps=50, n_steps_per_epoch=50, show_progress=False,
            logger_adapter=d3rlpy.logging.NoopAdapterFactory())
    action = dqn.predict(np.zeros((1, 4), np.float32))
    assert action.shape == (1,)
    other.close()
    buf.close()


def test_imitation_gail_trains_with_the_facade_as_its_generator_buffer(name, monkeypatch, tmp_path):
    imitation = pytest.importorskip("imitation")
    from imitation.algorithms.adversarial.gail import GAIL
    from imitation.data import buffer as imitation_buffer
    from imitation.data import rollout
    from imitation.rewards.reward_nets import BasicRewardNet
    from imitation.util import logger as imitation_logger
    from imitation.util.util import make_vec_env
    from stable_baselines3 import PPO

    from shmbuf.compat.imitation import ReplayBuffer

    made = []

    class Recorded(ReplayBuffer):  # imitation builds it as buffer.ReplayBuffer(capacity, venv)
        def __init__(self, *args, **kwargs):
            super().__init__(*args, name=f"{name}-{len(made)}", **kwargs)
            made.append(self)

    monkeypatch.setattr(imitation_buffer, "ReplayBuffer", Recorded)
    rng = np.random.default_rng(0)
    venv = make_vec_env("CartPole-v1", n_envs=2, rng=rng)
    demos = rollout.generate_trajectories(None, venv, rollout.make_sample_until(min_episodes=4), rng=rng)
    gen = PPO("MlpPolicy", venv, n_steps=64, batch_size=64, n_epochs=1, seed=0)
    gail = GAIL(demonstrations=demos, demo_batch_size=64, gen_replay_buffer_capacity=256,
                n_disc_updates_per_round=2, venv=venv, gen_algo=gen, allow_variable_horizon=True,
                reward_net=BasicRewardNet(venv.observation_space, venv.action_space),
                custom_logger=(log := imitation_logger.configure(str(tmp_path), format_strs=[])))
    gail.train(total_timesteps=512)
    assert len(made) == 1 and made[0].size() == 256  # full: stored by imitation's own store()
    batch = made[0].sample(8)
    assert isinstance(batch, imitation.data.types.Transitions) and batch.obs.shape == (8, 4)
    other = ReplayBuffer.attach(made[0].name)  # another process could sample it
    assert other.size() == 256
    other.close()
    made[0].close()
    venv.close()
    log.close()


@pytest.mark.timeout(900)
def test_torchrl_dqn_learns_cartpole_from_two_collector_processes_writing_by_name(name):
    """TorchRL's own DQN: its loss, QValueActor, EGreedyModule and MultiSyncCollector,
    whose 2 worker processes extend the shared buffer themselves (replay_buffer=).
    DQN's greedy policy swings from update to update (between about 110 and 500 in the
    runs here), so the greedy return is taken every 10 batches of the second half: its
    best must be five times a random policy's (about 20), the last one three times."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("torchrl")
    from tensordict.nn import TensorDictSequential
    from torchrl.collectors import MultiSyncCollector
    from torchrl.envs.utils import ExplorationType, set_exploration_type
    from torchrl.modules import MLP, EGreedyModule, QValueActor
    from torchrl.objectives import DQNLoss, SoftUpdate

    from helpers.torchrl_envs import cartpole
    from shmbuf.compat.torchrl import SharedReplayBuffer

    torch.manual_seed(0)
    torch.set_num_threads(1)
    env = cartpole()
    actor = QValueActor(MLP(out_features=2, num_cells=[64, 64]), in_keys=["observation"], spec=env.action_spec)
    actor(env.reset())  # (lazy layers take their shapes)
    frames, per_batch = 80_000, 400
    greedy = EGreedyModule(env.action_spec, annealing_num_steps=frames // 4, eps_init=1.0, eps_end=0.05)
    policy = TensorDictSequential(actor, greedy)
    rb = SharedReplayBuffer(50_000, name=name, lanes=2, batch_size=128, seed=0)
    loss = DQNLoss(actor, action_space=env.action_spec, delay_value=True)
    loss.make_value_estimator(gamma=0.99)
    target = SoftUpdate(loss, eps=0.995)
    optim = torch.optim.Adam(loss.parameters(), lr=1e-3)
    collector = MultiSyncCollector([cartpole, cartpole], policy, frames_per_batch=per_batch, total_frames=frames,
                                   replay_buffer=rb, init_random_frames=1000)

    def greedy_return():
        with set_exploration_type(ExplorationType.DETERMINISTIC), torch.no_grad():
            return float(env.rollout(500, actor)["next", "reward"].sum())
    writers, returns = set(), []
    for i, _ in enumerate(collector):  # (with replay_buffer=, the workers write, the loop gets None)
        writers |= {d["claimed_by"] for d in rb.buffer.stats()["lanes"] if d["claimed_by"]}
        if i % 10 == 0 and i * per_batch >= frames // 2:
            returns.append(greedy_return())
        if len(rb) < 1000:
            continue
        for _ in range(80):
            values = loss(rb.sample())
            optim.zero_grad()
            values["loss"].backward()
            optim.step()
            target.step()
        greedy.step(per_batch)
        collector.update_policy_weights_()
    collector.shutdown()
    assert len(writers) == 2 and os.getpid() not in writers  # the two workers wrote, each in a lane
    assert rb.write_count >= frames
    returns.append(greedy_return())
    rb.close()
    assert max(returns) >= 100 and returns[-1] >= 60, returns


def _cleanrl(script, *args, timeout=600):
    import json
    import subprocess
    import sys

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    res = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=timeout,
                         env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(900)
def test_sb3_cleanrl_dqn_with_one_import_changed_learns_as_with_sb3s_buffer(tmp_path):
    """examples/cleanrl_dqn.py (CleanRL's dqn.py for gymnasium 1.x) and the same file
    with its ReplayBuffer import switched to shmbuf's, seeded alike: the facade draws its
    batches as SB3's buffer does, so the two learn exactly alike, return for return."""
    pytest.importorskip("stable_baselines3")
    from benchmarks import clients

    examples = pathlib.Path(__file__).resolve().parents[1] / "examples"
    arms = clients.arms(examples, tmp_path)
    args = ["--seed", "2", "--total-timesteps", "60000", "--exploration-fraction", "0.5"]
    theirs = _cleanrl(arms["CleanRL + SB3's buffer"][0], *args)
    ours = _cleanrl(arms["CleanRL + shmbuf (1 import)"][0], *args)
    assert theirs["buffer"] == "stable_baselines3.common.buffers" and ours["buffer"] == "shmbuf.compat.sb3"
    assert ours["curve"] == theirs["curve"] and ours["last20"] == theirs["last20"], (ours, theirs)
    assert max(ours["curve"]) >= 150  # (it learns: a random policy gets about 20)


@pytest.mark.timeout(300)
def test_sb3_async_cleanrl_dqn_on_actors_runs_and_stops(tmp_path):
    """The asynchronous example, for a few seconds: actors add, the learner samples
    under the rate limit, and everything stops and is removed at the end."""
    pytest.importorskip("stable_baselines3")
    from shmbuf.core import segment

    examples = pathlib.Path(__file__).resolve().parents[1] / "examples"
    got = _cleanrl(examples / "cleanrl_dqn_actors.py", "--seconds", "8", "--learning-starts", "500")
    assert got["buffer"] == "shmbuf.compat.sb3 + shmbuf.Actors" and got["sps"] >= 0
    assert segment.list_names() == []  # the buffer and the weights were removed


@pytest.mark.timeout(600)
@pytest.mark.parametrize("script", ["cleanrl_sac.py", "cleanrl_td3.py"])
def test_sb3_cleanrl_sac_and_td3_run_unchanged_and_switched(tmp_path, script):
    """examples/cleanrl_sac.py and cleanrl_td3.py (CleanRL's SAC and TD3 for gymnasium
    1.x), unchanged and with the import switched (as scripts/bench-clients --loops runs
    them), a short run each: both train from their buffer, alike."""
    pytest.importorskip("stable_baselines3")
    from benchmarks import clients

    examples = pathlib.Path(__file__).resolve().parents[1] / "examples"
    args = ["--seed", "1", "--total-timesteps", "1200", "--learning-starts", "600", "--buffer-size", "5000"]
    theirs = _cleanrl(examples / script, *args)
    ours = _cleanrl(clients.switched(examples / script, tmp_path), *args)
    assert theirs["buffer"] == "stable_baselines3.common.buffers" and ours["buffer"] == "shmbuf.compat.sb3"
    for got in (theirs, ours):
        assert got["cpu_s"] > 0 and 0 < got["buffer_s"] < got["wall_s"] and len(got["curve"]) == 1
        assert -2000 < got["curve"][0] < 0  # Pendulum's returns
    assert ours["curve"] == theirs["curve"]  # the same batches (600 updates): the same learning
