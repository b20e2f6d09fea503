"""The reference libraries themselves, driven with the facades (scripts/test-libraries
runs this in a virtualenv of its own per library: their pins conflict with each other)."""

from __future__ import annotations

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
