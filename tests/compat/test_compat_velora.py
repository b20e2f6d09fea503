"""shmbuf.compat.velora, called as velora's users call ReplayBuffer (seed-semantics 1.3);
velora needs torch, so these run in the extras step."""

from __future__ import annotations

import json

import numpy as np
import pytest

import helpers

torch = pytest.importorskip("torch", reason="the velora facade needs torch, as velora does")
from shmbuf.compat.velora import BatchExperience, ReplayBuffer  # noqa: E402

pytestmark = pytest.mark.extras


def rb(name, capacity=100, **kw):
    return ReplayBuffer(capacity, state_dim=3, action_dim=1, hidden_dim=2, name=name, **kw)


def add_rows(buf, keys):
    k = torch.as_tensor(keys, dtype=torch.float32)
    buf.add_multi(k[:, None].repeat(1, 3), k, k, k[:, None].repeat(1, 3) + 1, k % 2 == 0, k[:, None].repeat(1, 2))


def test_add_keeps_the_newest_capacity_transitions(name):
    with rb(name) as buf:
        for i in range(150):
            buf.add(torch.full((1, 3), float(i)), torch.tensor(1.0), 2.0, torch.zeros((1, 3)), i % 2 == 1, torch.zeros(2))
        assert len(buf) == 100 and buf.metadata()["position"] == 50
        s = buf.state_dict()
        assert s["states"][49, 0] == 149 and s["states"][50, 0] == 50 and s["dones"][1, 0] == 1.0


def test_add_multi_wraps_and_keeps_the_last_capacity_rows(name):
    with rb(name) as buf:
        add_rows(buf, range(95))
        add_rows(buf, range(1000, 1008))  # wraps: slots 95..99 then 0..2
        s = buf.state_dict()["states"][:, 0]
        assert s[95:].tolist() == [1000, 1001, 1002, 1003, 1004] and s[:3].tolist() == [1005, 1006, 1007]
        assert buf.metadata()["position"] == 3 and len(buf) == 100
        add_rows(buf, range(2000, 2250))  # B > C: the last C rows, position (3 + 250) % 100
        assert buf.metadata()["position"] == 53
        assert sorted(buf.state_dict()["states"][:, 0].tolist()) == list(range(2150, 2250))


def test_single_and_batched_adds_interleave_in_order(name):
    with rb(name) as buf:
        for i in range(3):
            buf.add(torch.full((3,), float(i)), torch.tensor([0.0]), 0.0, torch.zeros(3), False, torch.zeros(2))
        add_rows(buf, [3, 4, 5, 6])
        assert buf.state_dict()["states"][:7, 0].tolist() == list(range(7))


def test_sample(name):
    with rb(name, device="cpu") as buf:
        assert tuple(buf.state_dict()["states"].shape) == (100, 3)  # full capacity, even empty
        add_rows(buf, [7])
        with pytest.raises(ValueError, match="Available: 1, Requested: 2"):
            buf.sample(2)
        add_rows(buf, range(70))
        b = buf.sample(64)
        assert isinstance(b, BatchExperience)
        assert [tuple(getattr(b, f).shape) for f in ("states", "actions", "rewards", "next_states", "dones", "hiddens")] \
            == [(64, 3), (64, 1), (64, 1), (64, 3), (64, 1), (64, 2)]
        assert all(getattr(b, f).dtype == torch.float32 for f in ("states", "rewards", "dones"))
        assert (b.next_states == b.states + 1).all() and (b.rewards[:, 0] == b.states[:, 0]).all()
        assert b.states.device.type == "cpu" and buf.config()["type"] == "ReplayBuffer"


def test_save_and_load_round_trip(name, tmp_path):
    with rb(name, device="cpu") as buf:
        add_rows(buf, range(130))
        buf.save(tmp_path / "ckpt")
        assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["buffer_metadata.json", "buffer_state.safetensors"]
        meta = json.loads((tmp_path / "ckpt" / "buffer_metadata.json").read_text())
        assert meta == {"capacity": 100, "state_dim": 3, "action_dim": 1, "hidden_dim": 2, "position": 30,
                        "size": 100, "device": "cpu"}
        with ReplayBuffer.load(tmp_path / "ckpt" / "buffer_state.json", meta, name=name + "b") as again:
            assert again.metadata() == meta and len(again) == 100 and str(again.device) == "cpu"
            for k, t in buf.state_dict().items():
                assert torch.equal(t, again.state_dict()[k])
            add_rows(again, [5000])  # goes on at position 30, over the oldest row
            assert again.state_dict()["states"][30, 0] == 5000
        buf.save(tmp_path / "other", prefix="x_")
        assert (tmp_path / "other" / "x_state.safetensors").exists()
        safetensors = pytest.importorskip("safetensors.numpy")
        real = safetensors.load_file(str(tmp_path / "ckpt" / "buffer_state.safetensors"))
        assert np.array_equal(real["states"], buf.state_dict()["states"].numpy())
        safetensors.save_file({k: v.numpy() for k, v in buf.state_dict().items()}, str(tmp_path / "real.safetensors"))
        with ReplayBuffer.load(tmp_path / "real.safetensors", meta, name=name + "c") as c:
            assert len(c) == 100


def test_damaged_state_files_are_refused(name, tmp_path):
    with rb(name) as buf:
        add_rows(buf, range(5))
        buf.save(tmp_path)
        meta = json.loads((tmp_path / "buffer_metadata.json").read_text())
    f = tmp_path / "buffer_state.safetensors"
    raw = bytearray(f.read_bytes())
    f.write_bytes(raw[:-4])
    with pytest.raises(ValueError, match="claims bytes"):
        ReplayBuffer.load(f, meta, name=name)
    with pytest.raises(ValueError, match="do not fit"):
        ReplayBuffer.load(f, {**meta, "size": 500}, name=name)


class Agent:
    """velora's agent protocol as warm uses it: an env with a spec id, predict(states, hidden)."""

    def __init__(self):
        import gymnasium as gym

        self.env = gym.make("CartPole-v1")

    def predict(self, states, hidden):
        return torch.zeros(len(states), dtype=torch.int64), torch.ones(len(states), 2)


def test_warm_fills_to_n_samples_and_stops_at_capacity(name):
    pytest.importorskip("gymnasium")
    agent = Agent()
    with ReplayBuffer(64, state_dim=4, action_dim=1, hidden_dim=2, name=name) as buf:  # CartPole: 4
        with pytest.raises(ValueError, match="at least 2"):
            buf.warm(agent, 10, num_envs=1)
        buf.warm(agent, 20, num_envs=4)
        assert 20 <= len(buf) < 24
        buf.warm(agent, 10_000, num_envs=4)  # more than it holds: stops when full
        assert len(buf) == 64 and buf.sample(8).hiddens.sum() == 16


@pytest.mark.timeout(120)
def test_another_process_adds_by_name_while_this_one_samples(name):
    with ReplayBuffer(64, state_dim=3, action_dim=1, hidden_dim=2, name=name) as buf:

        def check():
            if len(buf) < 16:
                return 0
            b = buf.sample(16)
            assert (b.next_states == b.states + 1).all() and (b.actions[:, 0] == b.states[:, 0]).all()
            assert (b.dones[:, 0] == (b.states[:, 0] % 2 == 0).float()).all()
            return 16
        size, checked = helpers.check_while_child_writes(helpers.velora_adder, (name, 300), check, timeout=90)
        assert size == 64 and checked > 0


def test_the_storage_velora_users_read_is_the_shared_memory(name):
    with rb(name) as buf:
        empty = buf.states
        assert tuple(empty.shape) == (100, 3) and empty.dtype == torch.float32 and not empty.any()
        assert [tuple(getattr(buf, k).shape) for k in ("actions", "rewards", "next_states", "dones", "hiddens")] \
            == [(100, 1), (100, 1), (100, 3), (100, 1), (100, 2)]
        add_rows(buf, range(95))
        add_rows(buf, range(1000, 1008))  # wraps: slots 95..99 then 0..2
        assert (buf.position, buf.size, len(buf)) == (3, 100, 100)
        assert buf.states[95:, 0].tolist() == [1000, 1001, 1002, 1003, 1004]
        assert buf.states[:4, 0].tolist() == [1005, 1006, 1007, 3] and buf.dones[:3, 0].tolist() == [0, 1, 0]
        other = ReplayBuffer.attach(buf.name)
        add_rows(other, [7777])  # another handle's write shows in this one's storage, zero-copy
        assert empty[3, 0] == 7777 and buf.position == 4 and buf.next_states[3, 0] == 7778
        other.close()
        kept = buf.hiddens
    assert kept[3, 0] == 7777  # the memory stays mapped while a view lives (no crash after close)


def test_load_sets_position_and_size(name, tmp_path):
    with rb(name) as buf:
        add_rows(buf, range(130))
        buf.save(tmp_path)
        meta = json.loads((tmp_path / "buffer_metadata.json").read_text())
        again = ReplayBuffer.load(tmp_path / "buffer_state.pt", meta, name=name + "l")
        assert (again.position, again.size) == (buf.position, buf.size) == (30, 100)
        assert torch.equal(again.states, buf.states)
        again.unlink()
        again.close()
