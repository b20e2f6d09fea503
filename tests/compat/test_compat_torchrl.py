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
    with pytest.raises(IndexError, match="holds 8 rows"):
        rb[8]
    for write in (lambda: rb.__setitem__(0, rows(0, 1)[0]), lambda: rb.set_("observation", torch.zeros(8, 3)),
                  lambda: rb.update_(rows(0, 8)), lambda: rb.set_at_("observation", torch.zeros(1, 3), [0])):
        with pytest.raises(NotImplementedError, match="writing into stored rows .* is refused"):
            write()  # (writes at given slots: refused; TorchRL's would change a copy, silently)
    assert (rb[:]["observation"][:, 0] == torch.tensor([0., 1, 2, 3, 7, 7, 7, 7])).all()
    with pytest.raises(IndexError):
        rb[torch.tensor([0.5])]
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


@pytest.mark.parametrize("module", ['torchrl', 'torchrl.buffers', 'torchrl.storage', 'torchrl.lazy', 'torchrl.ragged'])
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
    assert index.tolist() == [4 * rb.buffer.engine.lane + k % 4 for k in range(6)]  # as TorchRL's cursor goes
    rb.close()


# -- in the shape of TorchRL's TestBuffers (its repository's test/rb/test_rb_core.py): the same
# checks on shmbuf's buffers and, side by side, on TorchRL's own storages (written here, not copied)

KINDS = ["shmbuf", "shmbuf-prioritized", "torchrl-over-shmbuf", "torchrl-tensor", "torchrl-memmap"]
# torchrl-over-shmbuf: TorchRL's own TensorDictReplayBuffer, its writer and RandomSampler, over SharedStorage


@pytest.fixture(autouse=True)
def _closed():
    """Every buffer a test made with make() is closed after it, passed or failed."""
    yield
    while MADE:
        finish(MADE.pop())


MADE = []


def make(kind, size, name, **kw):
    rb = _make(kind, size, name, **kw)
    MADE.append(rb)
    return rb


def _make(kind, size, name, **kw):
    from torchrl.data import LazyMemmapStorage, LazyTensorStorage, TensorDictReplayBuffer

    from shmbuf.compat.torchrl import SharedPrioritizedReplayBuffer, SharedStorage

    kw.setdefault("batch_size", 3)
    if kind == "shmbuf":
        return SharedReplayBuffer(size, name=name, seed=0, **kw)
    if kind == "shmbuf-prioritized":
        return SharedPrioritizedReplayBuffer(size, alpha=0.8, beta=0.9, name=name, seed=0, **kw)
    if kind == "torchrl-over-shmbuf":
        return TensorDictReplayBuffer(storage=SharedStorage(size, name=name, seed=0), **kw)
    storage = (LazyTensorStorage if kind == "torchrl-tensor" else LazyMemmapStorage)(size)
    return TensorDictReplayBuffer(storage=storage, **kw)


def data(n, start=0):
    t = torch.arange(start, start + n)
    return TensorDict({"a": t, "b": TensorDict({"c": t * 10}, [n])}, [n])


def finish(rb):
    from shmbuf.compat.torchrl import SharedStorage

    if isinstance(rb, SharedReplayBuffer):
        rb.close()  # (twice is harmless)
    elif isinstance(rb.storage, SharedStorage):
        rb.storage.close()


def _torchrl_over_shmbuf(name, size=8, **kw):
    from torchrl.data import TensorDictReplayBuffer

    from shmbuf.compat.torchrl import SharedStorage

    return TensorDictReplayBuffer(storage=SharedStorage(size, name=name, seed=0, **kw), batch_size=3)


def row_set(td):
    return {(int(a), int(c)) for a, c in zip(td["a"].reshape(-1).tolist(), td["b", "c"].reshape(-1).tolist())}


@pytest.mark.parametrize("size", [3, 5, 100])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.filterwarnings("ignore:Got conflicting batch_sizes")  # (TorchRL's, on sample(1) with batch_size=3)
class TestBuffersShape:
    def test_cursor_after_extends(self, kind, size, name):
        rb = make(kind, size, name)
        rb.extend(data(5))
        assert rb.writer._cursor == 5 % size if size != 100 else rb.writer._cursor == 5
        if size == 5:
            rb.extend(data(size - 1))
            assert rb.writer._cursor == size - 1
        finish(rb)

    def test_add_then_sample_gives_it_back(self, kind, size, name):
        rb = make(kind, size, name)
        one = TensorDict({"a": torch.tensor(7), "b": TensorDict({"c": torch.tensor(70)}, [])}, [])
        rb.add(one)
        s = rb.sample(1)[0]
        assert s["a"] == 7 and s["b", "c"] == 70 and "index" in s.keys()
        finish(rb)

    def test_empty_then_sample_raises_torchrls_error(self, kind, size, name):
        rb = make(kind, size, name)
        for i in range(2):
            rb.add(TensorDict({"a": torch.tensor(i), "b": TensorDict({"c": torch.tensor(10 * i)}, [])}, []))
            assert rb.sample(1)[0]["a"] == i and int(rb[0]["a"]) == i and len(rb[:]) == 1
            rb.empty()
            assert len(rb) == 0
            with pytest.raises(RuntimeError, match="Cannot sample from an empty storage"):
                rb.sample()
        finish(rb)

    def test_after_empty_rows_start_again_at_slot_0(self, kind, size, name):
        rb = make(kind, size, name)
        rb.extend(data(size + 1))  # (a full ring, its oldest row at slot 1)
        rb.empty()
        index = rb.extend(data(2, start=50))
        assert index.tolist() == [0, 1] and rb.writer._cursor == 2 % size
        assert rb[:]["a"].tolist() == [50, 51] and rb.storage[1]["a"] == 51
        s = rb.sample()
        assert (rb[s["index"]]["a"] == s["a"]).all() and set(s["index"].tolist()) <= {0, 1}
        finish(rb)

    def test_extend_keeps_the_newest_rows_and_iterating_the_storage_reads_them(self, kind, size, name):
        rb = make(kind, size, name)
        rb.extend(data(5))
        assert len(rb) == min(size, 5)
        stored = [b for b in rb.storage]  # Storage.__iter__: get(i) for i < len
        assert len(stored) == len(rb)
        assert {(int(b["a"]), int(b["b", "c"])) for b in stored} == row_set(data(5)[-len(rb):])
        finish(rb)

    def test_samples_are_rows_that_were_written(self, kind, size, name):
        rb = make(kind, size, name)
        rb.extend(data(5))
        s = rb.sample()
        assert s.batch_size == (3,) and row_set(s) <= row_set(data(5)[-min(size, 5):])
        assert (s["a"] * 10 == s["b", "c"]).all()  # each row whole
        finish(rb)

    def test_index_reads_the_slot_as_the_storage_does(self, kind, size, name):
        rb = make(kind, size, name)
        rb.extend(data(5))
        d1, d2 = rb[2], rb.storage[2]
        assert d1.batch_size == () and (d1 == d2).all()
        assert int(d1["a"]) == (2 if size >= 5 else [3, 4, 2][2] if size == 3 else 2)
        s = rb.sample()
        assert (rb[s["index"]]["a"] == s["a"]).all()  # a sample's "index" reads its rows back
        assert (rb[-1]["a"] == rb[len(rb) - 1]["a"]).all()
        finish(rb)

    def test_index_before_full_sees_only_the_rows_written(self, kind, size, name):
        rb = make(kind, size, name)
        rb.extend(data(size - 1))
        assert len(rb[: size - 1]) == size - 1
        assert len(rb[size - 2:]) == 1
        assert rb[:]["a"].tolist() == list(range(size - 1))
        with pytest.raises(IndexError):
            rb[size - 1]
        finish(rb)

    def test_lazily_stacked_rows_extend_as_stacked_ones(self, kind, size, name):
        from tensordict import LazyStackedTensorDict

        rb = make(kind, size, name)
        tds = [TensorDict({"a": torch.tensor(i), "b": TensorDict({"c": torch.tensor(10 * i)}, [])}, [])
               for i in range(4)]
        rb.extend(LazyStackedTensorDict.lazy_stack(tds, 0))
        assert row_set(rb[:]) == row_set(torch.stack(tds)[-min(size, 4):])
        finish(rb)


@pytest.mark.parametrize("source", ["torchrl-tensor", "torchrl-memmap"])
@pytest.mark.filterwarnings("ignore:Loading the storage on an uninitialized")  # (TorchRL's memmap storage's)
def test_state_dicts_cross_between_torchrls_storages_and_shmbufs(source, name):
    """TorchRL -> shmbuf -> TorchRL: the same rows at the same slots, the write count
    and the cursor, for a full ring (the oldest row mid-storage) and a partial one."""
    for n in (13, 4):
        theirs = make(source, 8, None)
        theirs.extend(data(n))
        mine = SharedReplayBuffer(8, name=f"{name}-{n}", batch_size=3)
        mine.load_state_dict(theirs.state_dict())
        assert len(mine) == len(theirs) and mine.write_count == theirs.write_count
        assert mine.writer._cursor == theirs.writer._cursor
        assert (mine[:]["a"] == theirs[:]["a"]).all() and (mine[:]["b", "c"] == theirs[:]["b", "c"]).all()
        mine.extend(data(2, start=100))  # the next rows go where TorchRL's would
        theirs.extend(data(2, start=100))
        assert (mine[:]["a"] == theirs[:]["a"]).all()
        back = make(source, 8, None)
        back.load_state_dict(mine.state_dict())
        assert (back[:]["a"] == theirs[:]["a"]).all() and back.writer._cursor == theirs.writer._cursor
        fresh = SharedReplayBuffer(8, name=f"{name}-{n}-self", batch_size=3)  # and shmbuf -> shmbuf
        fresh.load_state_dict(mine.state_dict())
        assert (fresh[:]["a"] == mine[:]["a"]).all() and fresh.write_count == mine.write_count
        for rb in (mine, fresh):
            rb.close()


def _overwrite_slot_0_paused(rb_name, flag, go):
    from tests.helpers.processes import pause_at

    rb = SharedReplayBuffer.attach(rb_name)
    pause_at("writing", flag, go)
    rb.extend(data(1, start=99))
    rb.close()


@pytest.mark.parametrize("kind", ["shmbuf", "torchrl-over-shmbuf"])
@pytest.mark.parametrize("broken", [False, True])
def test_a_read_by_index_never_returns_a_row_being_written(name, tmp_path, broken, break_protection, kind):
    """A writer stopped in the middle of overwriting slot 0: ``rb[0]`` waits for the
    row (SampleTimeout at its deadline), and so does a sample by TorchRL's own sampler
    that draws slot 0 (in order, over the SharedStorage of TorchRL's own buffer); the
    other slots read as they are; once the writer goes on, ``rb[0]`` is its row, whole.
    With the stamp check switched off on purpose, ``rb[0]`` returns the slot while it
    is still unpublished: what the check prevents."""
    from torchrl.data import ReplayBuffer, SamplerWithoutReplacement

    from shmbuf.core.read import SampleTimeout
    from tests.helpers.processes import wait_for_file

    if broken:
        break_protection("stamp check")
    rb = SharedReplayBuffer(4, name=name, batch_size=2, timeout=1.0) if kind == "shmbuf" else \
        _torchrl_over_shmbuf(name, 4, timeout=1.0)
    in_order = ReplayBuffer(storage=rb.storage, sampler=SamplerWithoutReplacement(shuffle=False), batch_size=2)
    rb.extend(data(4))
    flag, go = str(tmp_path / "writing"), str(tmp_path / "go")
    proc = mp.get_context("spawn").Process(target=_overwrite_slot_0_paused, args=(name, flag, go))
    proc.start()
    try:
        wait_for_file(flag, proc, "the writer never reached its write")
        if broken:  # the row comes back before its writer published it
            rb[0]
            in_order.sample()
        else:
            with pytest.raises(SampleTimeout):
                rb[0]
            with pytest.raises(SampleTimeout):
                in_order.sample()  # (slots 0 and 1)
            assert rb[1:]["a"].tolist() == [1, 2, 3]
            open(go, "w").close()
            proc.join(60)
            assert proc.exitcode == 0
            assert int(rb[0]["a"]) == 99 and int(rb[0]["b", "c"]) == 990
    finally:
        open(go, "w").close()
        proc.join(60)
        rb.storage.close()


def test_prioritized_sampling_follows_torchrls_formulas(name):
    """Draw frequencies (p + eps)**alpha over the sum, weights (p / p_min)**-beta, new
    rows at the largest priority set, an update for a row overwritten since its sample
    skipped: TorchRL's PrioritizedSampler's rules, re-stated here (its C++ trees do not
    load with torch 2.13.0)."""
    from shmbuf.compat.torchrl import SharedPrioritizedReplayBuffer

    alpha, beta, eps = 0.7, 0.5, 1e-8
    rb = SharedPrioritizedReplayBuffer(4, alpha=alpha, beta=beta, eps=eps, name=name, batch_size=4000, seed=0)
    rb.extend(data(4))
    s = rb.sample()
    assert torch.allclose(s["priority_weight"], torch.ones(4000, dtype=s["priority_weight"].dtype))  # all equal
    p = torch.tensor([1.0, 2.0, 3.0, 4.0])
    rb.update_priority(torch.arange(4), p)
    s = rb.sample()
    want = (p + eps) ** alpha / ((p + eps) ** alpha).sum()
    freq = torch.bincount(s["index"], minlength=4).float() / 4000
    assert torch.allclose(freq, want, atol=0.03), (freq, want)
    w = ((p + eps) ** alpha / (p[0] + eps) ** alpha) ** -beta
    assert torch.allclose(s["priority_weight"].float(), w[s["index"]], rtol=1e-4)
    stale = s[s["index"] == 0][:1]  # a sample of the row in slot 0
    rb.extend(TensorDict({"a": torch.tensor([50]), "b": {"c": torch.tensor([500])}}, [1]))  # overwrites slot 0
    assert int(rb[0]["a"]) == 50
    stale["td_error"] = torch.tensor([1e-6])
    rb.update_tensordict_priority(stale)  # for the row gone: skipped
    fresh = rb.sample()
    assert (fresh["index"] == 0).float().mean() > 0.25  # the new row: the largest priority (4), not 1e-6
    rb.close()


def test_prioritized_rows_take_their_priority_key_and_updates_from_another_process(name):
    from shmbuf.compat.torchrl import SharedPrioritizedReplayBuffer

    rb = SharedPrioritizedReplayBuffer(8, alpha=1.0, beta=1.0, eps=0.0, name=name, batch_size=1000, seed=0)
    td = data(4)
    td["td_error"] = torch.tensor([1e-9, 1e-9, 1e-9, 1.0])
    rb.extend(td)
    assert (rb.sample()["a"] == 3).float().mean() > 0.99
    other = pickle.loads(pickle.dumps(rb))  # (as a collector's worker gets it)
    s = other.sample()
    s["td_error"] = torch.where(s["a"] == 3, torch.tensor(1e-12), torch.tensor(1.0))
    other.update_tensordict_priority(s)
    assert (rb.sample()["a"] == 3).float().mean() < 0.01  # the other process's update seen here
    with pytest.raises(ValueError, match="finite"):
        rb.update_priority(torch.tensor([0]), torch.tensor([float("nan")]))
    other.close()
    rb.close()


@pytest.mark.parametrize("kind", ["shmbuf", "torchrl-over-shmbuf"])
def test_a_state_the_buffer_cannot_hold_is_refused_before_any_row_changes(kind, name):
    """Round 4: a state dict with another key, another shape or dtype, or missing parts
    emptied the buffer and then refused the state (10 rows -> 0), and the shape error
    counted the padding rows the restore had added (6 rows, of 4 given). Now everything
    is checked first: the error counts the state's rows, and the 10 rows stay."""
    from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer

    rb = SharedReplayBuffer(16, name=name, batch_size=3) if kind == "shmbuf" else _torchrl_over_shmbuf(name, 16)
    rb.extend(data(10))
    before = rb[:]
    bad = {"another key": (data(4).update({"extra": torch.zeros(4)}), r"keys \['extra'\] the buffer does not"),
           "another shape": (TensorDict({"a": torch.zeros(4, 3, dtype=torch.long), "b": {"c": torch.zeros(4).long()}},
                                        [4]), r"key 'a': 4 rows of shape \[3\], this buffer's rows have the shape \[\]"),
           "another dtype": (TensorDict({"a": torch.full((4,), 0.5), "b": {"c": torch.zeros(4).long()}}, [4]),
                             "cannot store float32 values in a int64 field"),
           "a full ring": (TensorDict({"a": torch.zeros(9, 2).long(), "b": {"c": torch.zeros(9).long()}}, [9]),
                           r"key 'a': 8 rows of shape \[2\]")}
    for what, (rows_, why) in bad.items():
        theirs = TensorDictReplayBuffer(storage=LazyTensorStorage(8), batch_size=3)
        theirs.extend(rows_)
        with pytest.raises((ValueError, TypeError), match=why):
            rb.load_state_dict(theirs.state_dict())
        assert len(rb) == 10 and (rb[:] == before).all(), what
    if kind == "shmbuf":
        state = rb.state_dict()
        for part in ("_writer", "_transforms", "_batch_size"):
            with pytest.raises(ValueError, match=f"the state has no {part}"):
                rb.load_state_dict({k: v for k, v in state.items() if k != part})
            assert len(rb) == 10 and (rb[:] == before).all(), part
    with pytest.raises(ValueError, match="not a storage state this SharedStorage loads"):
        rb.storage.load_state_dict({"_storage": {"a": torch.zeros(4)}, "initialized": True, "_len": 4,
                                    "_order": torch.tensor([0, 1, 2, 9])})
    assert len(rb) == 10 and (rb[:] == before).all()
    rb.storage.close()


def test_torchrls_own_buffer_samplers_and_writer_over_the_shared_storage(name):
    """TorchRL's convention: swap the storage. Its TensorDictReplayBuffer, its
    RoundRobinWriter and samplers over a SharedStorage: rows at TorchRL's slots,
    RandomSampler and SamplerWithoutReplacement, SliceSampler (trajectories cut at
    dones and at the ring's newest row), shmbuf's prioritized sampler in TorchRL's
    buffer; another process's rows (written by name) are read and sampled here; a write
    at slots that are not the storage's next ones is refused, nothing written."""
    from torchrl.data import ReplayBuffer, SamplerWithoutReplacement, SliceSampler, TensorDictReplayBuffer

    from shmbuf.compat.torchrl import SharedPrioritizedSampler, SharedStorage

    storage = SharedStorage(12, name=name, seed=0)
    rb = TensorDictReplayBuffer(storage=storage, batch_size=6)
    assert rb.extend(data(14)).tolist() == [k % 12 for k in range(14)] and rb.writer._cursor == 2
    assert rb[:]["a"].tolist() == [12, 13] + list(range(2, 12))  # TorchRL's slots, the oldest at the cursor
    s = rb.sample()
    assert (s["a"] * 10 == s["b", "c"]).all() and (rb[s["index"]]["a"] == s["a"]).all()
    without = ReplayBuffer(storage=storage, sampler=SamplerWithoutReplacement(), batch_size=4)
    assert sorted(torch.cat([without.sample()["a"] for _ in range(3)]).tolist()) == list(range(2, 14))
    other = SharedReplayBuffer.attach(name)  # another handle (by name, as another process), shmbuf's writer
    other.extend(data(1, start=70))
    assert rb[2]["a"] == 70 and rb[2]["b", "c"] == 700 and len(rb) == 12  # read here
    for bad in (lambda: rb.__setitem__(5, data(1)[0]), lambda: storage.set(5, data(1)[0]),
                lambda: storage.set(torch.arange(2), data(2)),
                lambda: rb.extend(data(1))):  # TorchRL's writer: its cursor (2) is this process's alone
        with pytest.raises(ValueError, match=r"writes rows only at its next slots \(\[3"):
            bad()
    assert rb[:]["a"].tolist() == [12, 13, 70] + list(range(3, 12)) and len(rb) == 12
    with pytest.raises(TypeError, match="holds TensorDicts"):
        storage.set(2, torch.zeros(1))
    other.close()
    storage.close()

    episodes = TensorDict({"obs": torch.arange(10.), ("next", "done"): (torch.arange(10) % 5 == 4)[:, None]}, [10])
    slicing = TensorDictReplayBuffer(storage=SharedStorage(10, name=name + "-s"),
                                     sampler=SliceSampler(slice_len=5, end_key=("next", "done")), batch_size=10)
    slicing.extend(episodes)
    got = slicing.sample()["obs"].reshape(2, 5)
    assert all(row.tolist() in ([0., 1, 2, 3, 4], [5., 6, 7, 8, 9]) for row in got)  # whole episodes, in order
    slicing.storage.close()

    alpha, beta = 1.0, 1.0
    shared = SharedStorage(8, name=name + "-p", priority=alpha, seed=0)
    prb = TensorDictReplayBuffer(storage=shared, sampler=SharedPrioritizedSampler(shared, alpha, beta, eps=0.0),
                                 priority_key="td_error", batch_size=1000)
    prb.extend(data(4))
    prb.update_priority(torch.arange(4), torch.tensor([1e-9, 1e-9, 1e-9, 1.0]))
    assert (prb.sample()["a"] == 3).float().mean() > 0.99
    shared.close()


def test_torchrls_update_priority_errors_name_it_and_change_nothing(name):
    """Round 4: with eps=0 a priority of 0 passed the facade's check and the core
    refused it naming update_priorities, which the user never called; a priority whose
    (p + eps)**alpha overflows the trees' sum was taken (every later sample timed out).
    Now update_priority refuses both, naming itself and what to do; nothing changes."""
    from shmbuf.compat.torchrl import SharedPrioritizedReplayBuffer

    rb = SharedPrioritizedReplayBuffer(8, alpha=1.0, beta=1.0, eps=0.0, name=name, batch_size=4, seed=0, timeout=2.0)
    rb.extend(data(4))
    s = rb.sample()
    trees = rb.buffer.engine.priorities
    before = trees.sum.copy()
    with pytest.raises(ValueError, match=r"^update_priority: a priority of 0 with eps=0 .* pass priorities > 0, or "
                                         r"make the buffer with eps > 0"):
        rb.update_priority(s["index"], torch.zeros(4))
    with pytest.raises(ValueError, match=r"^update_priority: p\*\*a must be at most 2.24712e\+307 .* pass "
                                         r"priorities <= 2.24712e\+307"):
        rb.update_priority(s["index"], torch.full((4,), 1e308, dtype=torch.float64))
    s["td_error"] = torch.full((4,), 1e308, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"^update_priority: p\*\*a must be at most"):
        rb.update_tensordict_priority(s)
    assert (trees.sum == before).all()
    assert len(rb.sample()) == 4  # sampled, not a timeout
    rb.close()


# -- in the shape of TorchRL's storage tests (its repository's test/rb/test_storages.py)

STORES = ["torchrl-tensor", "torchrl-memmap", "shmbuf"]


@pytest.mark.parametrize("init_out", [True, False])
@pytest.mark.parametrize("storage_out", STORES)
@pytest.mark.parametrize("storage_in", STORES)
@pytest.mark.filterwarnings("ignore:Loading the storage on an uninitialized")
def test_a_buffers_state_dict_loads_into_any_storage(storage_in, storage_out, init_out, name):
    """A buffer of 100 rows filled with three transitions of ones; its state dict loads
    into a buffer over any storage, written to already or not: a sample is all ones."""
    transition = TensorDict({"observation": torch.ones(1, 4), "action": torch.ones(1, 2),
                             "reward": torch.ones(1, 1), "dones": torch.ones(1, 1),
                             "next": {"observation": torch.ones(1, 4)}}, batch_size=1)
    src = make(storage_in, 100, f"{name}-in", batch_size=3)
    for _ in range(3):
        src.extend(transition)
    state = src.state_dict()
    dst = make(storage_out, 100, f"{name}-out", batch_size=state["_batch_size"])
    if init_out:
        dst.extend(transition.apply(lambda x: x * 0))
    dst.load_state_dict(state)
    assert len(dst) == 3 and (dst.sample().exclude("index") == 1).all()


def test_lazy_stacks_ragged_along_another_dimension_are_refused_homogeneous_ones_are_rows(name):
    """A lazy stack along dimension 1 whose entries differ from one to the next (not
    rows of their own: shmbuf's ragged rows vary in their first dimension only): a
    ValueError naming the key, nothing written. A lazy stack of rows alike (a
    collector's) is stored as its dense rows."""
    from tensordict import LazyStackedTensorDict

    rb = make("shmbuf", 6, name, batch_size=2)
    ragged = LazyStackedTensorDict(TensorDict(a=torch.rand(5, 4, 8), batch_size=5),
                                   TensorDict(a=torch.rand(5, 3, 8), batch_size=5), stack_dim=1)
    with pytest.raises(ValueError, match="key 'a': its rows differ in shape along the batch dimension 1"):
        rb.extend(ragged)
    assert len(rb) == 0
    tds = [TensorDict({"obs": torch.rand(4, 8), "action": torch.rand(2)}, batch_size=()) for _ in range(10)]
    lazy = LazyStackedTensorDict.lazy_stack(tds, dim=0)
    other = make("shmbuf", 100, name + "-b", batch_size=10)
    other.extend(lazy)
    every = other[:]
    assert every["obs"].shape == (10, 4, 8) and torch.equal(every["obs"], lazy.to_tensordict()["obs"])
    assert torch.equal(every["action"], lazy.to_tensordict()["action"])


def test_a_buffer_is_attached_with_the_class_and_alpha_it_was_made_with(name):
    from shmbuf.compat.torchrl import SharedPrioritizedReplayBuffer

    rb = SharedPrioritizedReplayBuffer(8, alpha=0.6, beta=0.4, name=name, batch_size=4)
    rb.extend(data(4))
    plain = make("shmbuf", 8, name + "-plain")
    plain.extend(data(2))
    for wrong in (lambda: SharedReplayBuffer.attach(name),
                  lambda: SharedPrioritizedReplayBuffer.attach(name, alpha=0.7, beta=0.4),
                  lambda: SharedPrioritizedReplayBuffer.attach(name + "-plain", alpha=0.6, beta=0.4)):
        with pytest.raises(ValueError, match="attach with the class and alpha it was made with"):
            wrong()
    other = SharedPrioritizedReplayBuffer.attach(name, alpha=0.6, beta=0.4, batch_size=4)
    assert len(other) == 4 and "priority_weight" in other.sample().keys()
    other.close()
    rb.close()


# -- ragged rows: TorchRL's LazyStackStorage's, in shared memory ------------------------

def llm_rows(lengths, seed=0, prompt=4):
    """Rows as TorchRL's LLM collectors write them: a lazy stack of TensorDicts whose
    token entries differ in length (a GRPO group: one prompt, responses of any length)."""
    from tensordict import lazy_stack

    g = torch.Generator().manual_seed(seed)
    return lazy_stack([TensorDict({("tokens", "prompt"): torch.randint(0, 1000, (prompt,), generator=g),
                                   ("tokens", "response"): torch.randint(0, 1000, (n,), generator=g),
                                   ("log_probs", "response"): torch.randn(n, generator=g),
                                   ("masks", "response"): torch.rand(n, generator=g) > 0.3,
                                   "pairs": torch.randint(0, 9, (n % 3, 2), generator=g, dtype=torch.int16),
                                   ("next", "reward"): torch.tensor([float(n)]),
                                   ("next", "done"): torch.tensor([True])}, []) for n in lengths])


WRITES = [[3, 7, 1, 4], [2, 9, 5], [6], [0, 8, 11, 2, 5]]  # 13 rows into 8 slots: the ring goes round


def same_rows(ours, theirs):
    """The same rows, entry by entry, and the same shapes and values through TorchRL's
    lazy-stack reads (lists, nested tensors, padded tensors)."""
    assert type(ours).__name__ == type(theirs).__name__ and ours.batch_size == theirs.batch_size
    keys = sorted(theirs.keys(True, True), key=str)
    assert sorted(ours.keys(True, True), key=str) == keys
    if not ours.batch_dims:
        assert all(torch.equal(ours[k], theirs[k]) for k in keys)
        return
    for k in keys:
        a, b = ours.get(k, as_list=True), theirs.get(k, as_list=True)
        assert len(a) == len(b) and all(x.dtype == y.dtype and torch.equal(x, y) for x, y in zip(a, b)), k
        if not b[0].ndim:  # (scalars: stacked as they are)
            assert torch.equal(ours[k], theirs[k])
            continue
        pa, pb = ours.get(k, as_padded_tensor=True), theirs.get(k, as_padded_tensor=True)
        assert pa.shape == pb.shape and torch.equal(pa, pb), k
        if b[0].ndim == 1:  # (torch's jagged nested tensors: one ragged dimension)
            na, nb = ours.get(k, as_nested_tensor=True), theirs.get(k, as_nested_tensor=True)
            assert na.is_nested and na.size(0) == nb.size(0) and na.dim() == nb.dim()
            assert all(torch.equal(x, y) for x, y in zip(na.unbind(), nb.unbind())), k


@pytest.mark.parametrize("kind", ["storage", "lazy-storage", "recipe"])
def test_ragged_rows_read_back_as_torchrls_lazy_stack_storage_gives_them(kind, name):
    """The same writes into TorchRL's LazyStackStorage and into shmbuf's (SharedStorage
    in TorchRL's buffer; SharedLazyStackStorage; SharedLazyStackStorage the way the GRPO
    recipe passes it, storage=partial(cls, size) in a plain ReplayBuffer): the same
    samples for the same seeds, the same reads by index, the same shapes and values of
    lazy-stack reads (as_list, as_nested_tensor, as_padded_tensor)."""
    from functools import partial

    from torchrl.data import LazyStackStorage, ReplayBuffer, TensorDictReplayBuffer

    from shmbuf.compat.torchrl import SharedLazyStackStorage, SharedStorage

    if kind == "recipe":
        ours = ReplayBuffer(storage=partial(SharedLazyStackStorage, 8, name=name), batch_size=5)
        theirs = ReplayBuffer(storage=partial(LazyStackStorage, 8), batch_size=5)
    else:
        storage = SharedStorage(8, name=name) if kind == "storage" else SharedLazyStackStorage(8, name=name)
        ours = TensorDictReplayBuffer(storage=storage, batch_size=5)
        theirs = TensorDictReplayBuffer(storage=LazyStackStorage(8), batch_size=5)
    MADE.append(ours)
    for i, lengths in enumerate(WRITES):
        assert torch.equal(ours.extend(llm_rows(lengths, i)), theirs.extend(llm_rows(lengths, i)))
        assert len(ours) == len(theirs) and ours.write_count == theirs.write_count
    for seed in range(4):
        torch.manual_seed(seed)
        a = ours.sample()
        torch.manual_seed(seed)
        same_rows(a, theirs.sample())
    for index in (0, -1, slice(2, 6), torch.tensor([7, 0, 3, 3])):  # (TorchRL's rows keep the "index" its
        same_rows(ours[index], theirs[index].exclude("index"))      # writer set on them as they were stored)
    fields = ours.storage.buf.fields
    assert fields["tokens.response"][0] == ("tokens.response",) and fields["log_probs.response"][0] == ("tokens.response",)
    assert fields["masks.response"][0] == ("tokens.response",) and fields["pairs"][0] == (None, 2)
    if kind == "storage":  # (entries of one shape in every row of the first write: fixed fields)
        assert fields["tokens.prompt"][0] == (4,) and fields["next.reward"][0] == (1,)
    else:  # (every entry with a dimension is ragged: a later prompt may have any length)
        assert fields["tokens.prompt"][0] == (None,)
        longer = llm_rows([3, 2], 9, prompt=6)
        ours.extend(longer)
        theirs.extend(longer)
        same_rows(ours[-2:], theirs[-2:].exclude("index"))
    close_made()


def test_shmbufs_own_buffer_samples_ragged_rows_with_their_slots_and_by_priority(name):
    """SharedReplayBuffer (shmbuf's writer and sampler) and SharedPrioritizedReplayBuffer
    over ragged rows: every sampled row is the row its "index" slot holds (TorchRL's
    LazyStackStorage given the same writes is the reference)."""
    from torchrl.data import LazyStackStorage, TensorDictReplayBuffer

    from shmbuf.compat.torchrl import SharedPrioritizedReplayBuffer

    theirs = TensorDictReplayBuffer(storage=LazyStackStorage(8), batch_size=6)
    mine = make("shmbuf", 8, name, batch_size=6)
    prio = SharedPrioritizedReplayBuffer(8, alpha=0.7, beta=0.5, name=name + "-p", batch_size=6, seed=0)
    MADE.append(prio)
    for i, lengths in enumerate(WRITES):
        for rb in (theirs, mine, prio):
            rb.extend(llm_rows(lengths, i))
    for rb in (mine, prio):
        for _ in range(3):
            s = rb.sample()
            same_rows(s.exclude("index", "priority_weight", "shmbuf_row"), theirs[s["index"]].exclude("index"))
    s = prio.sample()
    s["td_error"] = torch.ones(6)
    prio.update_tensordict_priority(s)
    close_made()


def _extend_ragged_in_a_child(rb, seed):
    rb.extend(llm_rows([5, 1, 12], seed))


@pytest.mark.timeout(600)
def test_ragged_rows_written_by_other_processes(name):
    """Two collector processes (spawned: the buffer travels by name) write ragged rows
    into a buffer of 3 lanes; the learner reads them whole."""
    rb = make("shmbuf", 30, name, batch_size=30, lanes=3)
    rb.extend(llm_rows([2, 3], 0))
    rb.empty()
    procs = [mp.get_context("spawn").Process(target=_extend_ragged_in_a_child, args=(rb, s)) for s in (1, 2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(240)  # (a spawned child imports torch and torchrl first: tens of seconds on a loaded machine)
        assert p.exitcode == 0
    assert len(rb) == 6
    want = {tuple(r.tolist()) for s in (1, 2) for r in llm_rows([5, 1, 12], s).get(("tokens", "response"), as_list=True)}
    got = rb[:].get(("tokens", "response"), as_list=True)
    assert {tuple(r.tolist()) for r in got} == want
    other = pickle.loads(pickle.dumps(rb))
    assert other.storage.lengths == rb.storage.lengths and len(other.sample().get(("tokens", "response"), as_list=True)) == 30
    other.close()
    close_made()


def _marked(lengths, start):
    """Rows whose every value is their mark (reward, token, log-prob): a row read whole
    holds one mark; a row whose values come from another row does not."""
    from tensordict import lazy_stack

    return lazy_stack([TensorDict({"tokens": torch.full((n,), start + i), "logp": torch.full((n,), start + i + 0.0),
                                   "reward": torch.tensor(float(start + i))}, []) for i, n in enumerate(lengths)])


def _whole(td):
    rows = zip(td.get("tokens", as_list=True), td.get("logp", as_list=True), td["reward"].tolist())
    return all((t == r).all() and (lp == r).all() for t, lp, r in rows)


@pytest.mark.parametrize("broken", [False, True])
@pytest.mark.parametrize("read", ["sample", "torchrl-sample", "index"])
def test_a_ragged_row_whose_values_are_covered_while_read_is_read_again(read, broken, name, monkeypatch):
    """A read whose rows' values are covered by new rows after their fixed part was read
    (the arena's hook: writes in the middle of the read) reads them again: every row it
    returns is whole, its "index" the slot holding it. With the arena's check off on
    purpose, the rows come back with other rows' values."""
    from torchrl.data import TensorDictReplayBuffer

    from shmbuf.compat.torchrl import SharedStorage
    from shmbuf.core import arena

    if read == "sample":
        rb = make("shmbuf", 4, name, batch_size=4, arena=4 * 16 * 8 * 2, ragged=True)
    else:
        rb = TensorDictReplayBuffer(storage=SharedStorage(4, name=name, arena=4 * 16 * 8 * 2, seed=0, ragged=True),
                                    batch_size=4)
        MADE.append(rb)
    rb.extend(_marked([16] * 4, 0))
    if broken:
        monkeypatch.setattr(arena, "FAULTS", 1)

    def cover(point):
        if point == "reading":
            monkeypatch.setattr(arena, "HOOK", None)
            rb.extend(_marked([16] * 4, 100))  # (the arena holds 4 such rows: every record covered)
    monkeypatch.setattr(arena, "HOOK", cover)
    got = rb[0:4] if read == "index" else rb.sample()
    assert arena.HOOK is None  # (the hook ran)
    if broken:
        assert not _whole(got)
    else:
        assert _whole(got) and set(got["reward"].tolist()) <= {100.0, 101.0, 102.0, 103.0}
        if read != "index":
            assert torch.equal(rb[got["index"]]["reward"], got["reward"])
    close_made()


def test_ragged_schema_choices_and_what_is_refused(name):
    """ragged= names entries (and their length names); each refusal names the key, says
    what to do, and writes nothing."""
    from tensordict import LazyStackedTensorDict, NonTensorData, lazy_stack

    from shmbuf.compat.torchrl import SharedLazyStackStorage

    def refused(rb, rows, match):
        before = len(rb)
        with pytest.raises(ValueError, match=match):
            rb.extend(rows)
        assert len(rb) == before

    def rows(*specs):  # one TensorDict per row, entries as given
        return lazy_stack([TensorDict(s, []) for s in specs])

    # a later write whose entry varies in a field the first write kept fixed
    rb = _over(name + "-a")
    rb.extend(rows({"t": torch.arange(3), "p": torch.arange(2)}, {"t": torch.arange(5), "p": torch.arange(2)}))
    refused(rb, rows({"t": torch.arange(1), "p": torch.arange(2)}, {"t": torch.arange(2), "p": torch.arange(7)}),
            r"key 'p': its rows differ in shape .* fixed field of shape \[2\] .* ragged=\[...\] naming 'p'")
    # lengths that agreed (and varied) in the first write are one length: a later write that breaks it
    rb = _over(name + "-b")
    rb.extend(rows({"t": torch.arange(3), "m": torch.ones(3)}, {"t": torch.arange(5), "m": torch.ones(5)}))
    assert rb.storage.lengths == {"t": "t", "m": "t"}
    refused(rb, rows({"t": torch.arange(3), "m": torch.ones(4)}),
            r"row 0: key 'm' holds 4 values, 't' 3: the storage gave them one length, 't' .* ragged=\{'m': None\}")
    # ragged= : keys ragged from the start, a length of their own or a name
    rb = _over(name + "-c", ragged={"p": None, "t": "T", "m": "T"})
    rb.extend(rows({"t": torch.arange(3), "m": torch.ones(3), "p": torch.arange(2)}))
    assert rb.storage.buf.fields["p"][0] == (None,) and rb.storage.lengths == {"t": "T", "m": "T", "p": None}
    rb.extend(rows({"t": torch.arange(1), "m": torch.ones(1), "p": torch.arange(9)}))
    assert rb[-1]["p"].tolist() == list(range(9))
    # what no write stores, each naming its key
    for bad, match in [
        (rows({"t": torch.zeros(3, 2)}, {"t": torch.zeros(4, 3)}), r"key 't': row 1 has the shape \[4, 3\].* differ in a dimension after the first"),
        (rows({"t": torch.zeros(3, 2)}, {"t": torch.zeros(4)}), r"key 't': row 1 has the shape \[4\], row 0 \[3, 2\]: .* first dimension only"),
        (rows({"t": torch.zeros(3)}, {"t": torch.zeros(4, dtype=torch.int64)}), r"key 't': row 1 is torch.int64, row 0 torch.float32"),
        (rows({"t": torch.zeros(3), "s": NonTensorData("hi")}, {"t": torch.zeros(4), "s": NonTensorData("ho")}), r"key 's' holds no tensor"),
        (LazyStackedTensorDict(TensorDict(a=torch.rand(2, 4), batch_size=2), TensorDict(a=torch.rand(2, 3), batch_size=2), stack_dim=1),
         r"key 'a': its rows differ in shape along the batch dimension 1"),
    ]:
        fresh = _over(f"{name}-d{len(MADE)}")
        refused(fresh, bad, match)
        assert fresh.storage.buf is None  # (nothing made either)
    with pytest.raises(ValueError, match=r"ragged= names \['nope'\], which the first rows do not have"):
        _over(name + "-e", ragged=["nope"]).extend(rows({"t": torch.zeros(3)}))
    with pytest.raises(ValueError, match="arena=4096 is for ragged rows, and the first rows have none"):
        _over(name + "-f", arena=4096).extend(rows({"t": torch.zeros(3)}, {"t": torch.zeros(3)}))
    # the arena: a row larger than a lane's is refused; an extend larger than it is written in parts, and
    # TorchRL's writer (its own cursor) writes on after rows whose values were covered left
    rb = _over(name + "-g", arena=1024)
    rb.extend(rows({"t": torch.zeros(3)}, {"t": torch.zeros(5)}))
    rb.extend(rows(*[{"t": torch.full((100,), float(k))} for k in range(5)]))  # (2,000 bytes: in parts)
    assert len(rb) == 2 and rb[-1]["t"].tolist() == [4.0] * 100  # (the 1,024-byte arena holds two of them)
    assert rb.extend(rows({"t": torch.full((2,), 7.0)})).tolist() == [7] and rb.writer._cursor == 8
    assert len(rb) == 2 and rb[-1]["t"].tolist() == [7.0, 7.0]  # (its 8 bytes covered row 3's first ones)
    assert rb[0]["t"].tolist() == [4.0] * 100 and rb.storage.evicted == 6  # (8 rows written, 2 held)
    refused(_over(name + "-h", arena=1024), rows({"t": torch.zeros(2)}, {"t": torch.zeros(300)}),
            r"row 1's ragged values take 1,200 bytes, more than a lane's arena \(1,024 bytes: arena= over 1 lane\(s\)\); nothing was written. Make the storage with a larger arena=")
    for extra, match in [(rows({"u": torch.zeros(2)}), r"the rows have keys \['u'\] the buffer does not"),
                         (TensorDict({}, [2]), r"the rows lack \['t'\], ragged entries of this buffer")]:
        rb = _over(f"{name}-i{len(MADE)}")  # (a buffer each: TorchRL's writer moved its cursor before the refusal)
        rb.extend(rows({"t": torch.zeros(3)}, {"t": torch.zeros(5)}))
        refused(rb, extra, match)
    with pytest.raises(ValueError, match=r"state_dict\(\) of a SharedStorage with ragged entries \(\['t'\]\) is not supported yet"):
        rb.state_dict()
    # the drop-in's own refusals
    with pytest.raises(ValueError, match="SharedLazyStackStorage needs max_size"):
        SharedLazyStackStorage()
    with pytest.raises(ValueError, match="stack_dim=1: SharedLazyStackStorage stacks rows along dimension 0 only"):
        SharedLazyStackStorage(8, stack_dim=1)
    close_made()


def close_made():
    """Close the buffers this test made (before the name fixture checks that none is left)."""
    while MADE:
        finish(MADE.pop())


def _over(name, **kw):
    from torchrl.data import TensorDictReplayBuffer

    from shmbuf.compat.torchrl import SharedStorage

    rb = TensorDictReplayBuffer(storage=SharedStorage(16, name=name, seed=0, **kw), batch_size=2)
    MADE.append(rb)
    return rb


def test_dumps_and_loads_round_trip_ragged_rows(name, tmp_path):
    """rb.dumps(path) saves ragged rows (Buffer.save); loads() makes a storage that had no
    buffer with the saved fields and arena, and reads back the same rows."""
    from torchrl.data import TensorDictReplayBuffer

    from shmbuf.compat.torchrl import SharedLazyStackStorage

    rb = TensorDictReplayBuffer(storage=SharedLazyStackStorage(8, name=name), batch_size=3)
    back = TensorDictReplayBuffer(storage=SharedLazyStackStorage(8, name=name + "-back"), batch_size=3)
    MADE.extend([rb, back])
    rb.extend(llm_rows([3, 5, 0, 2]))
    rb.dumps(tmp_path / "rb")
    back.loads(tmp_path / "rb")
    assert back.storage.buf.fields == rb.storage.buf.fields and len(back) == 4
    same_rows(back[:], rb[:])
    close_made()
