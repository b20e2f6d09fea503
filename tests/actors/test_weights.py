"""shmbuf.Weights: versioned weights from a learner to actors, across real processes."""

from __future__ import annotations

import multiprocessing as mp

import numpy as np
import pytest

import shmbuf

import helpers
from helpers import weights_mixed, weights_of

pytestmark = pytest.mark.one_path  # (scripts/test runs it on one path)

CTX = mp.get_context("spawn")


def test_publish_read_and_cheap_skip(name):
    with shmbuf.Weights.create(name, weights_of(0)) as learner, shmbuf.Weights.attach(name) as actor:
        assert actor.version == 0 and actor.read() is None
        assert learner.publish(weights_of(1)) == 1 and learner.publish(weights_of(2)) == 2
        version, params = actor.read()
        assert version == 2 and not weights_mixed(params, 2)
        assert params["w1"].dtype == np.float32 and params["b1"].shape == (256,)
        assert actor.read(newer_than=2) is None
        params["w1"][:] = 9  # a copy: the shared weights are untouched
        assert actor.read()[1]["w1"][0, 0] == 2
        target = {k: np.zeros_like(v) for k, v in weights_of(0).items()}
        assert actor.load_into(target) == 2 and not weights_mixed(target, 2)


def test_bad_input_is_refused_and_changes_nothing(name):
    with shmbuf.Weights.create(name, weights_of(0)) as w:
        w.publish(weights_of(1))
        bad = weights_of(2)
        bad["w1"] = np.zeros((3, 3))
        with pytest.raises(ValueError, match="expected shape"):
            w.publish(bad)
        with pytest.raises(ValueError, match="exactly the arrays"):
            w.publish({"w1": np.zeros((256, 256))})
        assert w.version == 1 and not weights_mixed(w.read()[1], 1)
        with pytest.raises(FileExistsError):
            shmbuf.Weights.create(name, weights_of(0))
        with pytest.raises(ValueError, match="another schema"):
            shmbuf.Weights.create(name, {"x": np.zeros(3)}, exist_ok=True)
        with shmbuf.Weights.create(name, weights_of(0), exist_ok=True) as again:
            assert again.version == 1
    with shmbuf.Buffer.create({"x": ((), "int64")}, 4, name=name) as buf:
        with pytest.raises(shmbuf.FormatError, match="not shmbuf weights"):
            shmbuf.Weights.attach(buf.name)


@pytest.mark.timeout(120)
def test_a_publisher_stopped_half_way_never_shows_readers_a_mix(name, tmp_path):
    """Deterministic: the publisher stops after the first array of version 2, then is
    killed; readers keep getting version 1 whole, and a new learner takes over."""
    flag = str(tmp_path / "flag")
    proc = CTX.Process(target=helpers.weights_publish_then_hang, args=(name, flag, True))
    proc.start()
    try:
        helpers.wait_for_file(flag, proc, "the publisher never got half-way")
        with shmbuf.Weights.attach(name) as actor:
            version, params = actor.read()
            assert version == 1 and not weights_mixed(params, 1)
            proc.kill()
            proc.join(30)
            version, params = actor.read(timeout=1.0)  # no wait on the dead publisher
            assert version == 1 and not weights_mixed(params, 1)
            with shmbuf.Weights.create(name, weights_of(0), exist_ok=True) as learner:  # the restart
                assert learner.publish(weights_of(5)) == 2  # over the half-written copy
                version, params = actor.read(newer_than=1)
                assert version == 2 and not weights_mixed(params, 5)
                learner.unlink()
    finally:
        proc.kill()
        proc.join(30)


def test_readers_follow_a_new_segment_of_a_restarted_learner(name, monkeypatch):
    monkeypatch.setattr("shmbuf.actors.weights._RELINK_CHECK", 0.0)
    first = shmbuf.Weights.create(name, weights_of(0))
    first.publish(weights_of(1))
    first.publish(weights_of(2))
    with shmbuf.Weights.attach(name) as actor:
        assert actor.read()[0] == 2
        first.close()  # the learner is gone (its name with it)
        assert actor.read()[0] == 2  # the last version stays readable
        with shmbuf.Weights.create(name, weights_of(0)) as second:
            second.publish(weights_of(7))
            version, params = actor.read(newer_than=2)  # version 1 of the new learner: new here
            assert version == 1 and not weights_mixed(params, 7)


@pytest.mark.timeout(120)
def test_storm_of_publishes_and_reads_never_mixes_versions(name):
    with shmbuf.Weights.create(name, weights_of(0)):
        ready, results = CTX.Event(), CTX.Queue()
        procs = [CTX.Process(target=helpers.weights_publisher, args=(name, 3, ready, results))]
        procs += [CTX.Process(target=helpers.weights_reader, args=(name, 3, ready, results)) for _ in range(2)]
        got = helpers.run_together(procs, ready, results)
    readers = [r for r in got if r[0] == "reader"]
    assert all(mixed == 0 for _, _, mixed in readers), got
    assert sum(reads for _, reads, _ in readers) > 10


def test_weights_of_a_torch_model_across_processes(name):
    torch = pytest.importorskip("torch", reason="torch is an optional extra")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    with shmbuf.Weights.create(name, model.state_dict()) as w:
        assert w.publish(model.state_dict()) == 1
        results = CTX.Queue()
        p = CTX.Process(target=helpers.torch_actor, args=(name, results))
        p.start()
        version, out, again = results.get(timeout=60)
        p.join(60)
        x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
        assert version == 1 and again is None
        np.testing.assert_allclose(out, model(x).detach().numpy(), rtol=1e-6)


test_weights_of_a_torch_model_across_processes = pytest.mark.extras(test_weights_of_a_torch_model_across_processes)


def test_weights_left_open_are_removed_at_exit_without_warnings(name):
    import subprocess
    import sys

    code = ("import sys, numpy as np, shmbuf\n"
            "w = shmbuf.Weights.create(sys.argv[1], {'a': np.zeros(3)})\n"
            "w.publish({'a': np.ones(3)})\n")  # never closed
    res = subprocess.run([sys.executable, "-c", code, name], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and res.stderr == ""
    with pytest.raises(FileNotFoundError):
        shmbuf.Weights.attach(name)


def test_load_into_and_pull_take_a_timeout(name):
    """A read that keeps finding the current copy being written (its seq odd: made so
    here, as publishes that keep overtaking it) raises TimeoutError within the timeout
    given to load_into or to an actor's pull (they had none: 10 s, always)."""
    import time
    from shmbuf.actors import processes, weights as weights_module
    with shmbuf.Weights.create(name, weights_of(0)) as learner, shmbuf.Weights.attach(name) as reader:
        learner.publish(weights_of(1))
        w = learner._words
        w[weights_module.W_SEQ + (int(w[weights_module.W_CURRENT]) & 1)] |= 1
        actor = processes.Actor(0, 0, 0, None, reader, None, None)
        for call in (lambda: reader.load_into(weights_of(0), timeout=0.2),
                     lambda: actor.pull(weights_of(0), timeout=0.2)):
            t0 = time.monotonic()
            with pytest.raises(TimeoutError, match="kept overtaking the read for 0.2 s"):
                call()
            assert time.monotonic() - t0 < 5
        learner.unlink()
