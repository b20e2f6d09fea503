"""shmbuf.compat.torchrl: TorchRL's replay buffer over shared memory (scripts/test-libraries
runs these where torchrl is installed; TorchRL's own DQN drives it in test_libraries.py)."""

from __future__ import annotations

import multiprocessing as mp
import pickle

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchrl")
from tensordict import TensorDict  # noqa: E402

from shmbuf.compat.torchrl import SharedReplayBuffer  # noqa: E402

pytestmark = pytest.mark.libraries


def rows(start, n, lanes_of=0):
    t = torch.arange(start, start + n, dtype=torch.float32)
    return TensorDict({"observation": t[:, None].repeat(1, 3), "action": (t % 2).long(),
                       "next": {"observation": t[:, None].repeat(1, 3) + 1, "reward": t[:, None],
                                "done": (t % 5 == 4)[:, None]}}, [n])


def test_tensordicts_in_and_out_with_nested_keys_and_dtypes(name):
    rb = SharedReplayBuffer(100, name=name, batch_size=32, seed=0)
    index = rb.extend(rows(0, 10))
    assert index.tolist() == list(range(10)) and len(rb) == 10 and rb.write_count == 10
    b = rb.sample()
    assert b.batch_size == torch.Size([32]) and b["next", "done"].dtype == torch.bool
    assert b["action"].dtype == torch.int64 and b["next", "reward"].shape == (32, 1)
    t = b["observation"][:, 0]
    assert torch.equal(b["next", "observation"][:, 0], t + 1) and torch.equal(b["next", "reward"][:, 0], t)
    t_of_slot = torch.arange(10, dtype=torch.float32)  # (rows 0..9 in slots 0..9)
    assert torch.equal(t_of_slot[b["index"]], t)  # the index: each row's slot, as TorchRL's storages
    rb.extend(rows(10, 2))
    assert len(rb) == 12 and rb.write_count == 12
    rb.empty()  # as TorchRL's: the rows and the write count
    assert len(rb) == 0 and rb.write_count == 0
    rb.extend(rows(0, 3))
    assert rb.write_count == 3
    rb.close()


def test_a_batch_of_two_dimensions_is_rows_of_steps_and_the_write_count_travels_with_the_state(name):
    """A [4, 5] extend is 4 rows of 5 steps (TorchRL's ndim=1 storages), sampled as
    [n, 5]; a state dict keeps the write count (restored rows are new rows to shmbuf)."""
    rb = SharedReplayBuffer(100, name=name, batch_size=6, seed=0)
    steps = rows(0, 20).reshape(4, 5)
    index = rb.extend(steps)
    assert index.tolist() == [0, 1, 2, 3] and len(rb) == 4 and rb.write_count == 4
    b = rb.sample()
    assert b.batch_size == torch.Size([6, 5]) and b["observation"].shape == (6, 5, 3)
    assert (torch.diff(b["observation"][:, :, 0], dim=1) == 1).all()  # each row: 5 steps in order
    with pytest.raises(ValueError, match=r"rows of batch size \[2, 3\]: this buffer.s rows have the batch size \[5\]"):
        rb.extend(rows(0, 6).reshape(2, 3))
    state = rb.state_dict()
    rb.empty()
    rb.load_state_dict(state)
    assert len(rb) == 4 and rb.write_count == 4
    rb.close()


def test_its_parts_are_its_own_and_an_empty_buffer_says_what_torchrl_says():
    from torchrl.data.replay_buffers.samplers import RandomSampler

    with pytest.raises(TypeError, match="takes no sampler=: its storage, writer and sampler are shmbuf's"):
        SharedReplayBuffer(8, sampler=RandomSampler())
    empty = SharedReplayBuffer(8, batch_size=2)
    with pytest.raises(RuntimeError, match=r"^Cannot sample from an empty storage\.$"):
        empty.sample()


def test_bad_rows_are_refused_and_change_nothing(name):
    rb = SharedReplayBuffer(100, name=name, batch_size=64)
    rb.extend(rows(0, 4))
    with pytest.raises(ValueError, match=r"keys \['other'\] the buffer does not"):
        rb.extend(TensorDict({"observation": torch.zeros(2, 3), "other": torch.zeros(2)}, [2]))
    with pytest.raises(ValueError):
        rb.extend(rows(0, 2).apply(lambda x: x.unsqueeze(-1).repeat_interleave(2, -1)))  # other shapes
    assert len(rb) == 4
    rb.extend(TensorDict({"observation": torch.full((4, 3), 7.0)}, [4]))  # keys missing: zeros
    b = rb.sample()
    assert (b["next", "reward"][b["observation"][:, 0] == 7] == 0).all() and len(rb) == 8
    with pytest.raises(NotImplementedError, match="SharedSampler"):
        rb[0]
    rb.close()
    empty = SharedReplayBuffer(8, batch_size=2)
    with pytest.raises(RuntimeError, match="empty"):
        empty.sample()


def test_share_puts_no_lock_around_writes(name):
    rb = SharedReplayBuffer(16, name=name).share()
    assert rb.shared and not hasattr(rb._write_lock, "acquire")
    rb.close()


def _extend_in_a_child(rb, start):
    rb.extend(rows(start, 5))


def test_pickled_to_another_process_it_writes_into_the_same_rows(name):
    rb = SharedReplayBuffer(64, name=name, lanes=3, batch_size=64, seed=0)
    rb.extend(rows(0, 5))
    rb.empty()  # (as TorchRL's collectors do after their first write)
    procs = [mp.get_context("spawn").Process(target=_extend_in_a_child, args=(rb, s)) for s in (100, 200)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    got = set(rb.sample()["observation"][:, 0].long().tolist())
    assert got == set(range(100, 105)) | set(range(200, 205))
    assert sorted(rb.buffer.lane_sizes()) == [0, 5, 5]  # a lane each, none left claimed by the learner
    other = pickle.loads(pickle.dumps(rb))
    assert other.name == rb.name and len(other) == 10
    other.close()
    rb.close()


@pytest.mark.parametrize("module", ['torchrl'])
def test_the_modules_examples(module):
    """The modules' docstring examples (the package's doctest run leaves them out: they
    import the library)."""
    import doctest
    import importlib

    assert doctest.testmod(importlib.import_module(f"shmbuf.compat.{module}")).failed == 0



def test_a_storage_without_a_buffer_refuses_to_travel(name):
    """Trust round 3, item 6: pickled before its first write, each worker would make a
    private buffer whose rows vanish: refused, saying what to do."""
    rb = SharedReplayBuffer(100, name=name, batch_size=4)
    with pytest.raises(RuntimeError, match="no buffer yet.*Write a first batch here"):
        pickle.dumps(rb._storage)
    rb.extend(rows(0, 4))
    again = pickle.loads(pickle.dumps(rb._storage))  # by name, once it exists
    assert len(again) == 4
    again.close()
    rb.close()


def test_dumps_and_loads_round_trip_the_rows(name, tmp_path):
    rb = SharedReplayBuffer(64, name=name, batch_size=8, seed=0)
    rb.extend(rows(0, 30))
    rb.dumps(tmp_path / "rb")
    assert (tmp_path / "rb" / "storage").is_dir()
    other = SharedReplayBuffer(64, name=name + "-b", batch_size=256, seed=1)
    other.loads(tmp_path / "rb")
    assert len(other) == 30 and other._batch_size == 8  # (TorchRL's loads restores the batch size too)
    got = torch.cat([other.sample() for _ in range(40)])
    assert set(got["observation"][:, 0].tolist()) == set(float(t) for t in range(30))
    assert torch.equal(got["next", "reward"][:, 0], got["observation"][:, 0])
    other.close()
    rb.close()


def test_an_extend_longer_than_a_lane_keeps_the_last_rows_as_torchrl(name):
    """More rows than a lane holds: the last ones are kept, every row gets its slot
    (TorchRL's storages do the same), and nothing raises after writing."""
    rb = SharedReplayBuffer(8, name=name, batch_size=64, lanes=2, seed=0)
    index = rb.extend(rows(0, 6))  # a lane holds 4
    assert index.shape == (6,) and len(rb) == 4
    assert set(rb.sample()["observation"][:, 0].tolist()) == {2.0, 3.0, 4.0, 5.0}
    assert index[2:].tolist() == sorted(index[2:].tolist()) and set(index[:2].tolist()) <= set(index[2:].tolist())
    rb.close()
