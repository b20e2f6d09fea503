"""shmbuf.torch: as_tensors and TorchSampler, with real torch (an optional extra)."""

from __future__ import annotations

import multiprocessing as mp
import threading
import time

import numpy as np
import pytest

import shmbuf

import helpers

torch = pytest.importorskip("torch", reason="torch is an optional extra: pip install torch==2.13.0")
from shmbuf.torch import TorchSampler, as_tensors  # noqa: E402

pytestmark = pytest.mark.extras
CTX = mp.get_context("spawn")


def _sampler_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "shmbuf-TorchSampler"]


def test_as_tensors_shares_memory_and_keeps_dtypes(name):
    fields = {"obs": ((3,), torch.float32), "done": ((), torch.bool), "action": ((), "int64"),
              "frame": ((2, 2), "uint8")}
    with shmbuf.Buffer.create(fields, 8, name=name, seed=0) as buf:
        assert buf.fields["obs"][1] == np.float32 and buf.fields["done"][1] == np.bool_
        buf.extend({"obs": np.ones((4, 3)), "done": [True, False, True, False], "action": [1, 2, 3, 4],
                    "frame": np.zeros((4, 2, 2), np.uint8)})
        batch = buf.sample(5)
        t = as_tensors(batch)
        assert list(t) == list(batch)
        assert [t[k].dtype for k in t] == [torch.float32, torch.bool, torch.int64, torch.uint8]
        assert all(tuple(t[k].shape) == batch[k].shape for k in t)
        t["obs"][2, 1] = -5.0  # one memory: writing through the tensor writes the batch
        t["action"][0] = 77
        assert batch["obs"][2, 1] == -5.0 and batch["action"][0] == 77
        one = as_tensors(batch, dtype=torch.float32)  # floats and bools, not integers
        assert one["done"].dtype == torch.float32 and one["action"].dtype == torch.int64
        assert one["frame"].dtype == torch.uint8
        per = as_tensors(batch, dtype={"done": torch.float32})
        assert per["done"].tolist() == batch["done"].astype(np.float32).tolist()
        assert per["obs"].data_ptr() == t["obs"].data_ptr()
    with pytest.raises(TypeError, match="mapping"):
        as_tensors([np.zeros(2)])
    with pytest.raises(TypeError, match="no numpy equivalent"):
        shmbuf.Buffer.create({"x": ((), torch.bfloat16)}, 4)


def test_sampler_hands_out_batches_valid_until_the_next(name):
    with shmbuf.Buffer.from_data({"x": np.arange(1000), "y": np.arange(1000) * 2.0}, name=name) as buf:
        with TorchSampler(buf, batch_size=64, prefetch=2, seed=1) as s:
            b1 = next(s)
            kept = {k: v.clone() for k, v in b1.items()}
            deadline = time.monotonic() + 30
            while s._ready.qsize() < 2:  # the thread has filled every other slot
                assert time.monotonic() < deadline
                time.sleep(0.01)
            assert all(torch.equal(b1[k], kept[k]) for k in b1)
            assert (b1["y"] == b1["x"] * 2.0).all()
            b2 = next(s)
            assert b2["x"].shape == (64,) and b2["x"].dtype == torch.int64
        assert not _sampler_threads()


def test_sampler_casts_and_passes_sample_arguments(name):
    fields = helpers.EPISODE_FIELDS
    with shmbuf.EpisodeBuffer.create(fields, 64, name=name, seed=0) as buf:
        for start in (0, 10):
            buf.add_episode(helpers.simple_episode(start, [1.0, 2.0, 4.0]), terminated=True)
        with TorchSampler(buf, 16, n_step=2, gamma=0.5, dtype={"terminated": torch.float32}) as s:
            b = next(s)
            assert b["terminated"].dtype == torch.float32 and b["action"].dtype == torch.int64
            assert set(b["reward"].tolist()) <= {2.0, 4.0, 4.0}  # 1 + 0.5 * 2, 2 + 0.5 * 4, 4
            assert set(b["steps"].tolist()) <= {1, 2}


def test_sampler_of_a_prioritized_buffer(name):
    with shmbuf.Buffer.create({"x": ((), "int64")}, 32, priority=0.6, name=name) as buf:
        buf.extend({"x": np.arange(32)})
        with TorchSampler(buf, 8, beta=0.5) as s:
            b = next(s)
            assert b["index"].shape == (8, 2) and b["weight"].dtype == torch.float64
            assert buf.update_priorities(b["index"].numpy(), np.ones(8)) == 8


def test_sampler_raises_the_samplers_error_in_the_learner(name):
    with shmbuf.Buffer.create({"x": ((), "int64")}, 8, name=name) as buf:
        s = TorchSampler(buf, 4)
        with pytest.raises(ValueError, match="empty buffer"):
            next(s)
        with pytest.raises(StopIteration):
            next(s)
        s.close()
    assert not _sampler_threads()


def test_close_stops_a_sampler_waiting_on_a_rate_limit(name):
    rate = shmbuf.RateLimit(min_size=100, samples_per_insert=1.0)
    with shmbuf.Buffer.create({"x": ((), "int64")}, 200, rate=rate, name=name) as buf:
        buf.extend({"x": np.arange(10)})
        s = TorchSampler(buf, 4, timeout=60)
        time.sleep(0.3)
        t0 = time.monotonic()
        s.close()
        assert time.monotonic() - t0 < 30 and not _sampler_threads()


@pytest.mark.timeout(120)
def test_sampler_under_a_writer_storm_returns_only_whole_rows(name):
    with shmbuf.Buffer.create(helpers.STORM, 2048, lanes=2, name=name) as buf:
        ready, stop, results = CTX.Event(), CTX.Event(), CTX.Queue()
        procs = [CTX.Process(target=helpers.storm_writer, args=(name, w, 16, 30, ready, stop, results))
                 for w in range(2)]
        for p in procs:
            p.start()
        try:
            ready.set()
            while len(buf) < buf.capacity:
                assert all(p.is_alive() for p in procs)
                time.sleep(0.02)
            checked = 0
            with TorchSampler(buf, 128, prefetch=3) as s:
                for _, b in zip(range(200), s):
                    assert helpers.storm_torn({k: v.numpy() for k, v in b.items()}) == 0
                    checked += 128
        finally:
            stop.set()
            for p in procs:
                p.join(60)
        assert [p.exitcode for p in procs] == [0, 0] and checked == 200 * 128
    assert not _sampler_threads()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here: the CUDA path runs where a GPU is")
def test_sampler_on_cuda(name):
    with shmbuf.Buffer.from_data({"x": np.arange(1000), "y": np.arange(1000) * 2.0}, name=name) as buf:
        with TorchSampler(buf, 256, device="cuda", dtype=torch.float32) as s:
            for _, b in zip(range(50), s):
                assert b["x"].device.type == "cuda" and b["y"].dtype == torch.float32
                assert torch.equal(b["y"], (b["x"] * 2).float())
        assert as_tensors(buf.sample(4), device="cuda")["x"].device.type == "cuda"
