"""EpisodeBuffer: episodes written env by env into lanes, observations stored once,
one-step and n-step transitions (seed-semantics scenario 43), writers that die."""

from __future__ import annotations


import os

import numpy as np
import pytest

import shmbuf
import helpers
from helpers import episode_writer_then_hang, kill_when_there, simple_episode

F = helpers.EPISODE_FIELDS




def test_transitions_carry_the_next_observation_and_how_the_episode_ended(name):
    with shmbuf.EpisodeBuffer.create(F, 40, name=name, seed=0) as buf:
        buf.add_episode(simple_episode(0, [1, 2, 4, 8]), terminated=False)
        buf.add_episode(simple_episode(10, [1, 2, 4, 8, 16]), terminated=True)
        assert (len(buf), buf.transition_count, buf.num_episodes) == (11, 9, 2)
        b = buf.sample(2000)
        got = set(zip(b["obs"][:, 0].tolist(), b["next_obs"][:, 0].tolist(),
                      b["terminated"].tolist(), b["truncated"].tolist()))
        want = {(t, t + 1, False, t == 3) for t in range(4)} | {(t, t + 1, t == 14, False) for t in range(10, 15)}
        assert got == want  # every transition, the final rows never, the real final observations
        assert (b["action"] == b["obs"][:, 0] % 10).all()


def test_n_step_returns_match_seed_scenario_43(name):
    """d3rlpy's MultiStepTransitionPicker with r = [1, 2, 4, 8, 16], gamma 0.5, n 3. Its
    timeout episode of 5 observations is a truncated episode of 4 steps here."""
    with shmbuf.EpisodeBuffer.create(F, 40, name=name, seed=0) as buf:
        buf.add_episode(simple_episode(0, [1, 2, 4, 8]), terminated=False)
        buf.add_episode(simple_episode(10, [1, 2, 4, 8, 16]), terminated=True)
        b = buf.sample(3000, n_step=3, gamma=0.5)
        got = set(zip(b["obs"][:, 0].tolist(), b["reward"].tolist(), b["steps"].tolist(),
                      b["next_obs"][:, 0].tolist(), b["terminated"].tolist(), b["truncated"].tolist()))
        assert got == {(0, 3, 3, 3, False, False), (1, 6, 3, 4, False, True), (2, 8, 2, 4, False, True),
                       (3, 8, 1, 4, False, True),
                       (10, 3, 3, 13, False, False), (11, 6, 3, 14, False, False),
                       (12, 12, 3, 15, True, False), (13, 16, 2, 15, True, False), (14, 16, 1, 15, True, False)}


def test_a_vectorised_writer_keeps_each_envs_episodes_contiguous_in_its_lane(name):
    with shmbuf.EpisodeBuffer.create(F, 60, lanes=3, name=name, seed=0) as buf:
        with buf.writer(envs=3) as w:
            for t in range(8):
                end = np.array([t % 3 == 2, t == 7, False])
                w.add({"obs": np.stack([[100 * e + t] * 2 for e in range(3)]), "action": [t] * 3,
                       "reward": [1.0] * 3, "next_obs": np.stack([[100 * e + 50 + t] * 2 for e in range(3)])},
                      terminated=end, truncated=np.zeros(3, bool))
        b = buf.sample(3000)
        env, t, nxt = b["obs"][:, 0] // 100, b["obs"][:, 0] % 100, b["next_obs"][:, 0]
        ended = np.where(env == 0, t % 3 == 2, np.where(env == 1, t == 7, False))
        assert (nxt == np.where(ended, 100 * env + 50 + t, b["obs"][:, 0] + 1)).all()
        assert (b["terminated"] == ended).all()
        assert set(t[env == 2].tolist()) == set(range(7))  # the newest step waits for its next
        # env 0: episodes 0-2, 3-5, 6-7 (in progress); env 1: one of 8; env 2: one of 8 in progress
        assert buf.num_episodes == 5 and buf.transition_count == 3 * 8 - 2


@pytest.mark.parametrize("bad, error, match", [
    ({"obs": [0, 0], "action": 1, "reward": 1.0}, ValueError, "final observation"),
    ({"obs": [0, 0], "action": 1, "reward": 1.0, "next_obs": [0, 0, 0]}, ValueError, "next_obs"),
    ({"obs": [0, 0], "action": 1, "next_obs": [1, 1]}, ValueError, "reward"),
    ({"obs": [0, 0], "action": 1.5, "reward": 1.0, "next_obs": [1, 1]}, TypeError, "action"),
])
def test_bad_steps_are_refused_and_change_nothing(name, bad, error, match):
    with shmbuf.EpisodeBuffer.create(F, 16, name=name) as buf:
        with pytest.raises(error, match=match):
            buf.add(bad, terminated=True, truncated=False)
        with pytest.raises(TypeError, match="terminated"):
            buf.add({"obs": [0, 0], "action": 1, "reward": 1.0}, terminated=0, truncated=False)
        with pytest.raises(ValueError, match="more than a lane holds"):
            buf.add_episode(simple_episode(0, np.ones(16)))
        assert len(buf) == 0 and buf.num_episodes == 0
        with pytest.raises(ValueError, match="empty buffer"):
            buf.sample(1)
        buf.add({"obs": [0, 0], "action": 1, "reward": 1.0}, terminated=False, truncated=False)
        with pytest.raises(ValueError, match="no transition yet"):
            buf.sample(1)  # one step in progress: no next observation yet


@pytest.mark.parametrize("call", ["add", "add_episode"])
def test_a_first_step_that_fails_keeps_no_lane(name, call):
    with shmbuf.EpisodeBuffer.create(F, 16, name=name) as buf:  # one lane
        with pytest.raises(ValueError, match="final observation"):
            if call == "add":
                buf.add({"obs": [0, 0], "action": 1, "reward": 1.0}, terminated=True, truncated=False)
            else:
                buf.add_episode({"obs": np.zeros((2, 2)), "action": [1, 1], "reward": [1.0, 1.0]})
        assert buf.stats()["lanes"][0]["claimed_by"] is None
        with buf.writer(envs=1) as w:  # the only lane is free
            w.add({"obs": np.zeros((1, 2)), "action": [1], "reward": [1.0], "next_obs": np.ones((1, 2))},
                  terminated=np.ones(1, bool), truncated=np.zeros(1, bool))
        buf.add({"obs": [0, 0], "action": 1, "reward": 1.0}, terminated=False, truncated=False)
        with pytest.raises(ValueError, match="final observation"):  # a later failure keeps the lane
            buf.add({"obs": [0, 0], "action": 1, "reward": 1.0}, terminated=True, truncated=False)
        assert buf.stats()["lanes"][0]["claimed_by"] == os.getpid()
        buf.release_lane()
        assert buf.stats()["lanes"][0]["claimed_by"] is None and buf.total_added == 3


def test_torn_read_retries_leave_out_redraws_at_episode_boundaries(name):
    with shmbuf.EpisodeBuffer.create(F, 64, lanes=2, name=name, seed=0) as buf:
        with buf.writer(envs=2) as w:
            for t in range(40):
                w.add({"obs": np.zeros((2, 2)), "action": [0, 0], "reward": [1.0, 1.0],
                       "next_obs": np.zeros((2, 2))},
                      terminated=np.array([t % 3 == 2, t % 4 == 3]), truncated=np.zeros(2, bool))
        for _ in range(20):
            buf.sample(32)
            buf.sample_trajectories(4, 3)
        s = buf.stats()  # no writer ran meanwhile: no copy can have been torn
        assert s["torn_read_retries"] == 0 and s["redraws"] > 0 and s["rows_sampled"] > 0
        assert s["rows_inserted"] == buf.total_added == 80 + 13 + 10  # steps, final rows


def test_a_wrong_env_axis_is_refused(name):
    with shmbuf.EpisodeBuffer.create(F, 16, lanes=2, name=name) as buf, buf.writer(envs=2) as w:
        with pytest.raises(ValueError, match=r"expected shape \(2, 2\)"):
            w.add({"obs": np.zeros((3, 2)), "action": [0, 0, 0], "reward": [0.0] * 3},
                  terminated=np.zeros(2, bool), truncated=np.zeros(2, bool))
        with pytest.raises(ValueError, match="one flag per env"):
            w.add({"obs": np.zeros((2, 2)), "action": [0, 0], "reward": [0.0] * 2},
                  terminated=np.zeros(3, bool), truncated=np.zeros(2, bool))
        assert len(buf) == 0


def test_reserved_names_and_unknown_observations_are_refused():
    with pytest.raises(ValueError, match="reserved"):
        shmbuf.EpisodeBuffer.create({**F, "next_obs": ((2,), "float32")}, 8)
    with pytest.raises(ValueError, match="observations="):
        shmbuf.EpisodeBuffer.create(F, 8, observations=["pixels"])


def test_a_plain_buffer_is_not_attached_as_an_episode_buffer(name):
    with shmbuf.Buffer.create(F, 8, name=name):
        with pytest.raises(ValueError, match="not an episode buffer"):
            shmbuf.EpisodeBuffer.attach(name)


@pytest.mark.both_storages
def test_a_writer_killed_mid_episode_leaves_transitions_and_a_free_lane(name, tmp_path):
    with shmbuf.EpisodeBuffer.create({"obs": ((2,), "float32"), "reward": ((), "float32")}, 40,
                                     name=name, seed=0) as buf:
        flag = tmp_path / "wrote"
        kill_when_there(episode_writer_then_hang, (name, str(flag), 5), flag, "the writer never wrote its steps")
        b = buf.sample(500)  # steps 0..3 of the cut episode: their next observation is known
        assert set(b["obs"][:, 0].tolist()) == {100, 101, 0, 1, 2, 3}
        assert (b["next_obs"][:, 0] == b["obs"][:, 0] + 1).all() and b["terminated"].sum() > 0
        assert {int(e["obs"][0, 0]) for e in buf.sample_episodes(50)} == {100}  # never the cut one
        t = buf.sample_trajectories(100, 8)
        assert set(t["timestep"][:, -1].tolist()) == {1, 2, 3, 4}  # trajectories of it end at a transition
        buf.add({"obs": [50, 50], "reward": 0.0}, terminated=False, truncated=False)  # claims the lane again
        buf.add({"obs": [51, 51], "reward": 0.0, "next_obs": [52, 52]}, terminated=True, truncated=False)
        b = buf.sample(2000)
        assert set(b["obs"][:, 0].tolist()) == {100, 101, 0, 1, 2, 3, 50, 51}  # 4 -> 50 is no transition
        assert (b["next_obs"][:, 0] == b["obs"][:, 0] + 1).all()
        assert {int(e["obs"][0, 0]) for e in buf.sample_episodes(100)} == {100, 50}
        assert buf.num_episodes == 3


@pytest.mark.both_storages
def test_an_episode_numbered_but_never_written_is_not_counted(name, tmp_path):
    """A writer numbers an env's next episode as soon as one ends. If it closes before
    writing a step, the number goes back; if it is killed, the next claimer renumbers."""
    fields = {"obs": ((2,), "float32"), "reward": ((), "float32")}
    with shmbuf.EpisodeBuffer.create(fields, 40, name=name, seed=0) as buf:
        with buf.writer() as w:
            w.add({"obs": [0, 0], "reward": 1.0, "next_obs": [1, 1]}, terminated=True, truncated=False)
        flag = tmp_path / "wrote"
        kill_when_there(episode_writer_then_hang, (name, str(flag), 0), flag, "the writer never wrote its episode")
        buf.add_episode({"obs": [[7, 7]], "reward": [1], "next_obs": [8, 8]})
        assert buf.num_episodes == 3
        numbers = buf.sample_sequences(1, len(buf))["_episode"][0].tolist()
        assert numbers == [1, 1, 2, 2, 2, 3, 3]  # consecutive: no episode that is not there


def test_bad_steps_on_the_fast_path_are_refused_and_change_nothing(name):
    """Once every env has an episode going, add() goes straight to the native write;
    anything off the common case still gets the full checks."""
    with shmbuf.EpisodeBuffer.create(F, 32, lanes=2, name=name) as buf, buf.writer(envs=2) as w:
        no = np.zeros(2, bool)
        step = {"obs": np.zeros((2, 2), np.float32), "action": np.zeros(2, np.int64),
                "reward": np.zeros(2, np.float32)}
        w.add(step, terminated=no, truncated=no)
        w.add(step, terminated=no, truncated=no)
        for bad, error in (({**step, "obs": np.zeros((2, 3), np.float32)}, ValueError),
                           ({"obs": step["obs"], "action": step["action"], "rewrd": step["reward"]}, ValueError),
                           ({**step, "extra": step["reward"]}, ValueError),
                           ({**step, "action": np.zeros(2)}, TypeError)):
            with pytest.raises(error):
                w.add(bad, terminated=no, truncated=no)
        with pytest.raises(TypeError, match="terminated"):
            w.add(step, terminated=np.zeros(2, np.uint8), truncated=no)
        assert len(buf) == 4 and buf.transition_count == 2


def test_one_step_episodes_and_empty_buffers(name):
    """d3rlpy drops a one-step episode clipped as terminated (and merges it into the
    next); here it is one terminated transition."""
    with shmbuf.EpisodeBuffer.create(F, 16, name=name, seed=0) as buf:
        with pytest.raises(ValueError, match="empty buffer"):
            buf.sample_trajectories(1, 3)
        with pytest.raises(ValueError, match="no complete episode"):
            buf.sample_episodes(1)
        buf.add({"obs": [5, 5], "action": 1, "reward": 2.0, "next_obs": [6, 6]}, terminated=True, truncated=False)
        b = buf.sample(10)
        assert b["terminated"].all() and (b["next_obs"] == 6).all() and buf.transition_count == 1
        assert buf.sample_episodes(1)[0]["reward"].tolist() == [2.0]


def test_fifo_keeps_whole_episodes_of_the_d3rlpy_limit_example(name):
    """d3rlpy, limit 5: episodes A, B (3 steps, terminated) and C (3 steps, timeout) leave
    [B0, B1, B2, C0, C1]. Here rows are the unit (each episode 4: its final observation),
    so 8 rows keep B and C whole, and C's last step is a transition (truncated)."""
    with shmbuf.EpisodeBuffer.create(F, 8, name=name, seed=0) as buf:
        for first, term in ((0, True), (10, True), (20, False)):
            buf.add_episode(simple_episode(first, [1, 1, 1]), terminated=term)
        assert (buf.num_episodes, buf.transition_count) == (2, 6)
        assert set(buf.sample(500)["obs"][:, 0].tolist()) == {10, 11, 12, 20, 21, 22}
        assert {int(e["obs"][0, 0]) for e in buf.sample_episodes(100)} == {10, 20}


@pytest.mark.both_storages
def test_a_writer_killed_inside_a_write_leaves_no_torn_or_false_transition(name, tmp_path):
    """Deterministic: the writer stops in the middle of copying env 0's row (one lane per
    env, no lock), is SIGKILLed there; the learner goes on, the half-written row is never
    read, both lanes can be claimed again."""
    fields = {"obs": ((2,), "float32"), "reward": ((), "float32")}
    with shmbuf.EpisodeBuffer.create(fields, 40, lanes=2, name=name, seed=0) as buf:
        flag = tmp_path / "writing"
        kill_when_there(helpers.episode_writer_hang_in_write, (name, str(flag), 4), flag, "the writer never reached the middle of a write")
        assert (buf.num_episodes, buf.transition_count) == (2, 6)  # the row being written: not counted
        b = buf.sample(1000)
        assert set(b["obs"][:, 0].tolist()) == {0, 1, 2, 100, 101, 102}  # step 3: no next yet
        assert (b["next_obs"][:, 0] == b["obs"][:, 0] + 1).all()
        with buf.writer(envs=2) as w:  # the dead writer's lanes are free again
            w.add({"obs": [[50, 50], [150, 150]], "reward": [1, 1], "next_obs": [[51, 51], [151, 151]]},
                  terminated=np.ones(2, bool), truncated=np.zeros(2, bool))
        assert {int(e["obs"][0, 0]) for e in buf.sample_episodes(50)} == {50, 150}
        assert set(buf.sample(1000)["obs"][:, 0].tolist()) == {0, 1, 2, 100, 101, 102, 50, 150}


def test_an_episode_buffer_pickles_as_its_name(name):
    import pickle
    with shmbuf.EpisodeBuffer.create(F, 16, name=name) as buf:
        buf.add_episode(simple_episode(0, [1, 2]), terminated=True)
        other = pickle.loads(pickle.dumps(buf))
        try:
            assert isinstance(other, shmbuf.EpisodeBuffer) and other.name == name
            assert (other.num_episodes, other.transition_count) == (1, 2)
        finally:
            other.close()


def test_episode_buffer_of_fields_and_capacity_is_create_and_bad_args_say_so(name):
    """Trust round 3, item 13: ``EpisodeBuffer(fields, capacity)`` as ``Buffer(...)``."""
    eb = shmbuf.EpisodeBuffer({"obs": ((), "float32")}, 16, name=name)
    assert isinstance(eb, shmbuf.EpisodeBuffer) and eb.capacity == 16 and len(eb) == 0
    with shmbuf.Buffer.attach(name) as core:
        again = shmbuf.EpisodeBuffer(core)  # wrapping an attached buffer, as before
        assert again.name == name
    with pytest.raises(TypeError, match="takes the fields and capacity of a new buffer"):
        shmbuf.EpisodeBuffer(16)
    eb.close()
