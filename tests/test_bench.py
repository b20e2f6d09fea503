"""The benchmark machinery, on a tiny workload (its figures are not checked: speed is
measured by scripts/bench, never asserted by tests)."""

from __future__ import annotations

import importlib.util
import json
import pathlib

import numpy as np
import pytest

from benchmarks import peers
from benchmarks import report
from benchmarks import run

pytestmark = [pytest.mark.one_path, pytest.mark.slow]  # (scripts/test runs it on one path; --quick not at all)

TINY = peers.Workload("tiny", 2048, {
    "obs": ((3,), np.float32), "next_obs": ((3,), np.float32), "action": ((2,), np.float32),
    "reward": ((), np.float32), "done": ((), np.bool_)})


@pytest.fixture
def tiny(monkeypatch):
    monkeypatch.setitem(peers.WORKLOADS, "tiny", TINY)
    monkeypatch.setitem(run.WORKLOADS, "tiny", TINY)


def test_a_tiny_run_measures_every_metric_and_reports(tiny, tmp_path, monkeypatch):
    names = ["shmbuf", "shmbuf-py", "naive", "numpy"] + (["cpprb"] if importlib.util.find_spec("cpprb") else [])
    out_calls = []  # which systems' out= sampler was asked for (the learners beside writers must not)
    for cls in (peers.ShmbufSystem, peers.NumpySystem):
        monkeypatch.setattr(cls, "sampler_out", lambda self, f=cls.sampler_out: out_calls.append(self.name) or f(self))
    cfg = run.Config.make(True, workloads=("tiny",), peers=tuple(names), repeats=2, window=0.05,
                          e2e_window=0.1, e2e_repeats=1, progress=False)
    res = run.run(cfg)
    fig = res.figures["tiny"]
    for metric in ("add 1w x1", "add 1w x64", "add 2w x1", "add 2w x64", "sample +1w", "e2e ingest"):
        assert len(fig[metric]["shmbuf"]) == (1 if metric.startswith("e2e") else 2), metric
        assert all(v > 0 for v in fig[metric]["shmbuf"])
        assert "naive" in fig[metric]
    assert "numpy" in fig["add 1w x64"] and "numpy" not in fig["add 2w x64"]
    # the default call for every system, out= beside it for those whose API has it
    assert fig["sample"].keys() == set(names) - {"naive"}
    assert fig["sample out="].keys() == {"shmbuf", "shmbuf-py", "numpy"}
    assert all(len(v) == 2 and min(v) > 0 for v in fig["sample out="].values())
    assert sorted(out_calls) == sorted(["shmbuf", "shmbuf-py", "numpy"] * 2)  # once a repeat: never the learners'
    # every figure against the machine's limit measured in this run
    lim = res.extra["limits"]["tiny"]
    assert res.extra["gather batches/s"]["tiny"].keys() == {"shared", "rows", "private", "private rows"}
    beside = res.extra["limit repeats"]["tiny"]  # measured in each repeat, beside the samples
    assert len(beside) == 2 and lim["gather"] == "repeats" and lim["batches/s"] == np.median(beside) > 0
    assert lim["rows/s"] == pytest.approx(res.extra["memcpy GB/s"] * 1e9 / TINY.row_bytes)
    assert res.extra["bytes per transition"]["tiny"]["shmbuf"] > 0
    assert res.extra["lock uncontended ns/pair"] > 0
    assert len(res.extra["attached processes"]["tiny"]["per process"]) == 2
    text = report.markdown(res)
    for title in ("| tiny: metric |", "| tiny: figure / machine limit |", "| tiny: shmbuf ... |",
                  "| tiny: target |", "| physical limit", "| default call / out= call", "Spread: "):
        assert title in text
    assert "2 writers x64 vs 1 writer x64" in text
    row = next(line for line in text.splitlines() if line.startswith("| tiny: sample 256, shmbuf |"))
    a, b = res.median("tiny", "sample", "shmbuf"), res.median("tiny", "sample out=", "shmbuf")
    assert row.endswith(f"| {report._of_limit(a, b)} |")
    # the learner first: writers held to the learner by a rate limit, measured beside the others
    for metric in ("sample +1w", "writer during sample", "e2e ingest", "e2e batches"):
        assert all(v > 0 for v in fig[metric]["shmbuf-lf"]), metric
    assert "shmbuf-lf" not in fig["sample"] and " shmbuf-lf |" in text
    assert "sample (default call) vs the gather limit (shared memory)" in text
    assert "sample out= vs the gather limit (shared memory)" in text
    path = run.save(res, str(tmp_path))
    with open(path) as f:
        saved = json.load(f)
    assert saved["figures"]["tiny"]["add 1w x1"]["shmbuf"] == fig["add 1w x1"]["shmbuf"]


def test_targets_judge_ratios():
    r = run.Results(config={}, machine={})
    for system, v in (("shmbuf", 300.0), ("cpprb", 100.0), ("numpy", 1000.0)):
        r.add("w", "add 1w x1", system, v)
    r.add("w", "sample", "shmbuf", 70.0)
    r.add("w", "sample", "numpy", 100.0)
    r.add("w", "add 1w x1", "shmbuf-py", 900.0)
    got = {what: (ratio, met) for what, ratio, _, met in report.targets(r, "w")}
    assert got["add 1w x1 vs cpprb"] == (3.0, False)  # >= 10 wanted
    assert got["add 1w x1 vs numpy floor"] == (0.3, False)
    assert got["sample vs numpy floor (default calls)"] == (0.7, False)
    assert got["sample out= vs numpy floor (out= both)"] == (None, None)
    assert got["e2e ingest vs cpprb"] == (None, None)
    assert got["pure Python: add 1w x64 vs numpy floor"] == (None, None)
    r.figures["w"]["add 1w x1"]["shmbuf"] = [2500.0]
    got = {what: (ratio, met) for what, ratio, _, met in report.targets(r, "w")}
    assert got["add 1w x1 vs numpy floor"] == (2.5, True)


def test_the_default_sample_returns_a_new_batch_and_out_refills_one(tiny):
    """What "sample" and "sample out=" measure: the default call gives a new batch each
    call (as users write it), the out= call the same arrays every time."""
    fill = TINY.data(1024, 3)
    systems = [peers.ShmbufSystem(TINY), peers.ShmbufSystem(TINY, pure=True), peers.NumpySystem(TINY)]
    try:
        for s in systems:
            s.fill(fill)
            default, into = s.sampler(), s.sampler_out()
            a, b = default(), default()
            assert a.keys() >= TINY.fields.keys() and len(a["obs"]) == peers.BATCH, s.name
            assert not any(np.shares_memory(a[k], b[k]) for k in TINY.fields), s.name
            c, d = into(), into()
            assert all(c[k] is d[k] for k in TINY.fields), s.name
    finally:
        for s in systems:
            s.close()
    assert peers.System(TINY).sampler_out() is None  # cpprb, torchrl, sb3: only their default


def test_the_report_sets_figures_against_the_limits_and_marks_wide_spreads():
    r = run.Results(config={}, machine={})
    r.extra["memcpy GB/s"] = 10.0
    r.extra["limits"] = {"w": {"batches/s": 1000.0, "gather": "private rows", "rows/s": 4e6, "row bytes": 2500}}
    for v in (400.0, 500.0, 520.0):  # spread 120 / 500 = 24%: marked
        r.add("w", "sample", "shmbuf", v)
    for v in (800.0, 810.0, 790.0):  # 2.5%: not
        r.add("w", "sample out=", "shmbuf", v)
    r.add("w", "add 1w x64", "shmbuf", 1e6)
    r.add("w", "add 1w x64", "shmbuf", 1e6)
    text = report.limits_table(r, "w")
    assert "| sample 256, no writer: default call (a new batch each call) | 1k batches/s | 0.50 |" in text
    assert "| sample 256, no writer: out= (one batch refilled) | 1k batches/s | 0.80 |" in text
    assert "| add, 1 writer, 64 rows per call | 4M rows/s | 0.25 |" in text
    assert "Here: the gather from private memory, of whole rows; memcpy 10.0 GB/s over 2,500 bytes." in text
    figs = report.figures_table(r, "w")
    assert "500 (400-520, **24%**)" in figs and "800 (790-810, 2.5%)" in figs
    assert report.spread_note(r).endswith("1 of the 3 figures here do (treat them as rough): w sample shmbuf 24%.")
    assert report.default_vs_out(r) == [("w: sample 256, shmbuf", 500.0, 800.0)]
    assert "| w: sample 256, shmbuf | 500 | 800 | 0.62 |" in report.default_vs_out_table(r)
    r.figures["w"]["sample"]["shmbuf"] = [500.0, 505.0]
    assert report.spread_note(r).endswith("none of the 3 figures here does.")


def test_the_queue_bench_reports_take_with_and_without_out_against_memcpy():
    from benchmarks import queue

    got = {"shmbuf queue": [(1000.0, 0.5), (1200.0, 0.4)], "shmbuf queue, take(out=)": [(2000.0, 0.3)] * 2,
           "multiprocessing.Queue": [(500.0, 0.9), (505.0, 0.9)]}
    text = queue.markdown(got, 2, 16, memcpy=queue.unroll_bytes() * 4000 / 1e9)  # limit: 4,000 unrolls/s
    assert "= 4,000 unrolls/s" in text
    assert "| shmbuf queue | 1,100 (1,000-1,200, **18.2%**) | 0.275 | 45% | 1.00x |" in text
    assert "| shmbuf queue, take(out=) | 2,000 (2,000-2,000, 0.0%) | 0.500 | 30% | 0.55x |" in text
    assert text.endswith("in bold past 10%: shmbuf queue 18.2%.")


@pytest.mark.timeout(100)  # (it waited 300 s for the reports of processes that had died)
def test_the_attached_memory_part_fails_at_once_when_its_processes_die(name):
    """Its spawned processes attach by name: where they die (here: no such buffer), it
    says so as soon as one has exited instead of waiting for their reports."""
    import types

    from benchmarks import limits

    system = types.SimpleNamespace(buf=types.SimpleNamespace(name=name), bytes=0, wl=TINY)
    with pytest.raises(RuntimeError, match=r"did not report: exit codes \[(1, (1|-9)|-9, 1)\]"):
        limits.attach_memory(run.Results(config={}, machine={}), system, 1)


def test_a_learner_held_by_the_rate_limit_ends_its_window_with_its_writers_stopped(tiny):
    """The learner-first learner samples until its window ends; where its writers have
    stopped (here: none runs) the rate limit holds it, and the window still ends on time
    with the batches it got (it raised RateLimitTimeout after the buffer's 10 s)."""
    from benchmarks import learner

    s = learner.LearnerFirst(TINY)
    pool = run.WriterPool(s, size=1)
    try:
        s.fill(TINY.data(1024, 3))
        got = pool.window(0, run.E2E_CHUNK, 0.5, "sample")
        allowed = s.limit.error_buffer / peers.BATCH  # (min_size is the rows the fill inserted)
        assert 0 < got["batches/s"] * 0.5 <= allowed  # what the limit allows, then nothing
    finally:
        pool.close()
        s.close()


def test_memory_guard(tiny, monkeypatch):
    class Tiny:
        available = 1000
    monkeypatch.setattr(run.psutil, "virtual_memory", lambda: Tiny)
    with pytest.raises(MemoryError, match="--peers"):
        run._build(TINY, run.Config(workloads=("tiny",)), run.Progress(1, False),
                   run.Results(config={}, machine={}))


@pytest.mark.skipif(not (importlib.util.find_spec("torchrl") and importlib.util.find_spec("stable_baselines3")),
                    reason="the optional torch peers are not installed (scripts/bench --torch installs them)")
def test_torch_peers_on_a_tiny_run(tiny):
    cfg = run.Config.make(True, workloads=("tiny",), peers=("shmbuf", "torchrl", "sb3"), repeats=1,
                          window=0.05, e2e_window=0.1, e2e_repeats=1, progress=False)
    fig = run.run(cfg).figures["tiny"]
    assert fig["add 2w x64"]["torchrl"][0] > 0 and fig["e2e ingest"]["torchrl"][0] > 0
    assert fig["add 1w x1"]["sb3"][0] > 0 and fig["sample"]["sb3"][0] > 0
    assert "sb3" not in fig["add 1w x64"]  # it has no batched add


def test_the_episode_part_compares_episode_buffers_with_buffers(monkeypatch):
    from benchmarks import episodes

    small = peers.Workload("mujoco", 4096, peers.WORKLOADS["mujoco"].fields)
    monkeypatch.setitem(peers.WORKLOADS, "mujoco", small)
    monkeypatch.setattr(episodes, "_cpprb_bytes", lambda wl, cap: None)
    cfg = run.Config.make(True, workloads=("mujoco",), peers=("shmbuf",), repeats=1, window=0.02,
                          progress=False, episodes="only")
    res = run.run(cfg)
    figs = res.extra["episodes"]["mujoco"]
    assert figs["sample 256"].keys() == {"Buffer", "Buffer out=", "EpisodeBuffer"}
    assert all(v[0] > 0 for m in figs.values() for v in m.values())
    assert res.extra["limits"]["mujoco"]["batches/s"] > 0  # measured in this run, the part alone
    mem = res.extra["episode memory"]["mujoco"]
    assert mem["EpisodeBuffer (obs once)"] < mem["Buffer (obs + next_obs)"]
    text = report.markdown(res)
    assert "| mujoco: one-step sample |" in text and "| mujoco: EpisodeBuffer (obs once) |" in text
    assert "| episodes, mujoco: sample 256, Buffer |" in text  # its default call / out=
    si = report.si(res.extra["limits"]["mujoco"]["batches/s"])
    assert any(line.startswith("| mujoco: sample 256 |") and f"| {si} |" in line for line in text.splitlines())
    assert not res.figures  # "only": the core workloads did not run


def test_the_strategies_part_measures_priorities_and_hindsight(monkeypatch):
    """Prioritized sample + update beside cpprb's (when installed), costs over uniform,
    HER beside the plain sample, on small buffers; the report shows the ratios."""
    from benchmarks import strategies
    small = peers.Workload("mujoco", 4096, TINY.fields)
    monkeypatch.setitem(strategies.WORKLOADS, "mujoco", small)
    monkeypatch.setattr(strategies, "HER_CAPACITY", 4096)
    cfg = run.Config.make(True, workloads=("mujoco",), strategies="only", repeats=2, window=0.05, progress=False)
    res = run.run(cfg)
    figs = res.extra["strategies"]
    assert len(figs["sample 256 + update 256"]["shmbuf"]) == 2
    assert all(v > 0 for v in figs["episode sample 256 (goals)"]["HER future 0.8"])
    assert set(figs["sample 256"]) == {"shmbuf", "shmbuf uniform", "shmbuf uniform out="}
    assert res.extra["limits"]["goals"]["row bytes"] == strategies.GOALS_WORKLOAD.row_bytes
    if importlib.util.find_spec("cpprb"):
        assert "cpprb MP" in figs["sample 256 + update 256"]
    assert not res.figures and "episodes" not in res.extra  # only that part
    text = report.markdown(res)
    assert "| HER future 0.8 / plain one-step sample |" in text
    assert "| strategies: sample 256, shmbuf uniform |" in text  # its default call / out=


def test_the_persistence_bench_measures_every_figure(tmp_path):
    from benchmarks import persist as bench

    t = bench.throughput("mujoco", 8192, 1, str(tmp_path))
    assert set(t) == {"save", "np.save", "load", "np.load"} and all(v[0] > 0 for v in t.values())
    rate = bench.writer_rate("mujoco", 8192, str(tmp_path), 1.0)
    assert rate["idle"] > 0 and rate["saving"] > 0
    c = bench.counter_cost(1)
    assert len(c) == 4 and all(v[0] > 0 for v in c.values())
    assert list(tmp_path.iterdir()) == []  # its saves are removed


def test_the_storage_bench_measures_every_figure(tmp_path, monkeypatch):
    from benchmarks import peers
    from benchmarks import storage

    small = {k: peers.Workload(w.name, 2048, w.fields) for k, w in peers.WORKLOADS.items()}
    monkeypatch.setattr(storage, "WORKLOADS", small)
    res = {"cached": storage.cached(str(tmp_path), 1, 0.05),
           "larger": {"limit MiB": 1, "file MiB": 4, "rows": 10, "skipped": "not here"},
           "resume": storage.resume(str(tmp_path), 8192, 1)}
    assert [r["workload"] for r in res["cached"]] == ["mujoco", "atari", "mujoco"]
    assert all(v > 0 for r in res["cached"] for k, v in r.items() if k != "workload")
    assert all(res["resume"][k] > 0 for k in ("attach", "save", "load"))
    text = storage.markdown(res)
    assert "| mujoco |" in text and "skipped: not here" in text and "faster than load" in text
    assert list(tmp_path.iterdir()) == []  # its files are removed


def test_bench_clients_switches_one_import_and_reports_medians_and_ratios(tmp_path):
    from benchmarks import clients

    examples = pathlib.Path(__file__).resolve().parents[1] / "examples"
    cmds = clients.arms(examples, tmp_path)
    original = (examples / "cleanrl_dqn.py").read_text().splitlines()
    switched = pathlib.Path(cmds["CleanRL + shmbuf (1 import)"][0]).read_text().splitlines()
    assert [(a, b) for a, b in zip(original, switched) if a != b] == \
        [(clients.SB3_IMPORT.strip(), clients.SHMBUF_IMPORT.strip())] and len(original) == len(switched)
    run = lambda seed, wall, solved: {"seed": seed, "wall_s": wall, "sps": 60000 / wall, "solved_s": solved,
                                      "last20": 480.0}
    text = clients.report({"a": [run(1, 30, 20), run(2, 40, None)], "b": [run(1, 27, 18), run(2, 40, 30)],
                           "c": [run(1, 20, 10), run(2, 30, 12)]}, 60000)
    assert "| a | 35.0 | 1,750 | > 35.0 | 1/2 | 480.0 |" in text  # (20 s, and never: the median is never)
    assert "shmbuf / SB3 loop time (per seed, median): 0.95" in text  # (0.9 and 1.0)
    assert "async / CleanRL's original" not in text  # (the original's median is "never")
    text = clients.report({"a": [run(1, 30, 20), run(2, 40, 22)], "b": [run(1, 27, 18), run(2, 40, 30)],
                           "c": [run(1, 20, 10), run(2, 30, 12)]}, 60000)
    assert "async / CleanRL's original: 11.0 s / 21.0 s = 0.52" in text
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "cleanrl_dqn.py").write_text("import numpy\n")
    with pytest.raises(SystemExit, match="no longer has the line"):
        clients.arms(tmp_path / "bad", tmp_path)


def test_bench_clients_loops_report_the_switched_scripts_cpu_ratio(tmp_path):
    from benchmarks import clients

    examples = pathlib.Path(__file__).resolve().parents[1] / "examples"
    for name in clients.LOOPS:
        copy = clients.switched(examples / f"cleanrl_{name}.py", tmp_path)
        diff = [(a, b) for a, b in zip((examples / f"cleanrl_{name}.py").read_text().splitlines(),
                                       copy.read_text().splitlines()) if a != b]
        assert diff == [(clients.SB3_IMPORT.strip(), clients.SHMBUF_IMPORT.strip())]

    def run(seed, cpu, buffer_s, last):
        return {"seed": seed, "cpu_s": cpu, "wall_s": cpu + 1, "buffer_s": buffer_s, "curve": [None, -300, last]}

    got = {"kind": "loops", "args": {"sac": ["--total-timesteps", "3000"]},
           "machine": {"cpus": 2, "python": "3", "numpy": "2", "date": "2026-11-28"},
           "runs": {"sac": {"sb3": [run(1, 100, 2.0, -150), run(2, 110, 2.2, -170)],
                            "shmbuf": [run(1, 95, 1.5, -140), run(2, 121, 1.6, -160)]}}}
    text = clients.loops_report(got)
    row = [line for line in text.splitlines() if line.startswith("| sac")][0]
    assert "| 3000 | 2 | 105.0 | 108.0 | 1.025 (0.950-1.100) |" in row  # per-seed ratios 0.95 and 1.1
    assert "2.10 / 1.55" in row and "-160.0 / -150.0" in row



def _ragged_batch(rows):
    from benchmarks import ragged

    return ragged.collate([ragged.rollout(r) for r in rows])


def test_the_ragged_verifier_passes_the_rollouts_and_catches_any_changed_value():
    """benchmarks.ragged's trainers count only tokens :func:`verify` passed: it must pass
    the generators' rollouts and refuse a batch with any one value, length or row wrong."""
    from benchmarks import ragged

    rows = [0, 2, 4, 1, 6, 3]  # two generators' rows, interleaved as a queue delivers them
    b = _ragged_batch(rows)
    due = [0, 1]
    assert ragged.verify(b, due, 2) == int(ragged.lengths(np.array(rows))[1].sum())
    assert due == [8, 5]  # the next row each generator owes
    for field, i in (("prompt", 70), ("response", 3), ("response", -1), ("logprobs", 5), ("mask", 9),
                     ("reward", 2), ("version", 1)):
        bad = {k: v.copy() for k, v in b.items()}
        bad[field][i] = bad[field][i] + 1 if field != "mask" else 1 - bad[field][i]
        with pytest.raises(ragged.Mismatch):
            ragged.verify(bad, [0, 1], 2)
    swapped = {k: v.copy() for k, v in b.items()}
    swapped["response"][:2] = swapped["response"][1::-1]  # the same values, out of place
    with pytest.raises(ragged.Mismatch, match="response"):
        ragged.verify(swapped, [0, 1], 2)
    other = {k: v.copy() for k, v in b.items()}
    lo, hi = other["response_offsets"][1:3]
    other["response"][lo:hi] += 8192  # a whole row holding another row's tokens (a shifted key)
    with pytest.raises(ragged.Mismatch, match="response"):
        ragged.verify(other, [0, 1], 2)
    shorter = {k: v.copy() for k, v in b.items()}
    shorter["response_offsets"][1:] -= 1  # row 0 one token short, the rest shifted
    with pytest.raises(ragged.Mismatch, match="lengths"):
        ragged.verify(shorter, [0, 1], 2)
    for lost in ([0, 4, 1], [0, 2, 2, 1], [2, 0, 1]):  # a row lost, delivered twice, out of order
        with pytest.raises(ragged.Mismatch, match="generator 0"):
            ragged.verify(_ragged_batch(lost), [0, 1], 2)


def test_a_tiny_ragged_run_verifies_tokens_through_every_arm(tmp_path):
    """Every arm of ``scripts/bench --ragged`` moves and verifies tokens (never a speed)."""
    from benchmarks import ragged

    res = ragged.run(quick=True, window=0.2, rounds=1, progress=False)
    assert not ragged.failed(res), {n: r for n, r in res["arms"].items() if "error" in r[0]}
    names = list(res["arms"])
    assert sum("multiprocessing.Queue" in n and "torch" not in n for n in names) == 3
    assert sum("torch.multiprocessing.Queue" in n for n in names) == (3 if res["torch"] else 0)
    assert sum(n.startswith("memcpy floor") for n in names) == 2
    for name, runs in res["arms"].items():
        assert runs[0]["batches"] > 0 and runs[0]["tokens/s"] > 0, name
    text = ragged.markdown(res)
    assert "| target | ratio | wanted | met |" in text and "Best queue" in text
    if res["shmbuf unavailable"]:
        assert "shmbuf ragged: not available on this commit" in text
    else:
        assert any(n.startswith("shmbuf") for n in names)
        ip = res["in process"]
        assert ip["take s"] > 0 and ip["segment / payload"] > 1  # (the segment holds its payload, and more)
    path = ragged.save(res, str(tmp_path))
    with open(path) as f:
        assert json.load(f)["arms"].keys() == res["arms"].keys()


def test_the_llm_checks_pass_fresh_rollouts_and_catch_stale_reordered_or_changed_ones():
    """benchmarks.llm counts only rows its check passed: versions within max_staleness of
    the trainer's, a generator's rows in order with gaps (rows passed over as stale) but
    none twice, and the infos dict of every row."""
    from benchmarks import llm, ragged

    arm = llm.Queue("list")
    arm.control = llm.Control(f"{llm.PREFIX}-test-{id(arm):x}", create=True)
    try:
        arm._reset()
        arm.control.publish(10)

        def batch(rows, versions, **change):
            items = [{**ragged.rollout(r), "version": v, "t": 0.0, "infos": llm.infos(r)} for r, v in zip(rows, versions)]
            for it in items:
                it.update(change)
            return ragged.collate(items)

        due = [0, 1]
        assert arm.check(batch([0, 4, 1], [8, 9, 10]), due) > 0 and due == [6, 3]  # row 2 passed over: a gap
        assert arm.kept == 3 and sorted(arm.ages_v) == [0, 1, 2]
        for rows, versions, change, what in (([6], [7], {}, "version"),        # 3 behind: stale
                                             ([6], [11], {}, "version"),       # a version not yet published
                                             ([4], [10], {}, "generator 0"),   # again
                                             ([8, 6], [10, 10], {}, "generator 0"),  # out of order
                                             ([6], [10], {"infos": {"finish_reason": "stop", "env": "x"}}, "infos")):
            with pytest.raises(ragged.Mismatch, match=what):
                arm.check(batch(rows, versions, **change), list(due))
        assert arm.keep({"version": 8}) and not arm.keep({"version": 7}) and arm.dropped == 1
    finally:
        arm.control.unlink()


def test_a_tiny_llm_run_verifies_tokens_through_every_arm_here_and_leaves_nothing(tmp_path):
    """Every arm of ``scripts/bench-ragged`` whose packages this virtualenv has (the Ray
    and TorchRL arms are left out where Ray is absent) moves, verifies and turns into
    jagged tensors tokens, within the staleness bound, and leaves no /dev/shm file."""
    from benchmarks import llm

    res = llm.run(quick=True, window=0.3, rounds=1, progress=False)
    assert not llm.failed(res), {n: r for n, r in res["arms"].items() if "error" in r[0]}
    names = list(res["arms"])
    have = res["available"]
    assert any(n.startswith("shmbuf queue") for n in names) and any(n.startswith("memcpy floor") for n in names)
    assert any(n.startswith("multiprocessing.Queue") for n in names)
    assert any("torch.multiprocessing" in n for n in names) == have["torch"]
    assert any(n.startswith("Ray") for n in names) == have["ray"]
    assert any(n.startswith("Arrow") for n in names) == have["pyarrow"]
    for name, runs in res["arms"].items():
        r = runs[0]
        assert r["batches"] > 0 and r["tokens/s"] > 0, name
        if not name.startswith("memcpy floor"):
            assert r["age versions max"] <= llm.STALENESS and r["jagged"] == have["torch"], name
    assert res["left over"] == [] and not llm._leftovers()
    text = llm.markdown(res)
    assert "| system, knob | verified tokens/s |" in text and "**shmbuf queue" in text
    path = llm.save(res, str(tmp_path))
    with open(path) as f:
        assert json.load(f)["arms"].keys() == res["arms"].keys()
