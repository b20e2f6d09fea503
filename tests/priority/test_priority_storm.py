"""The storm of add_each writers and priority updates (both paths: scripts/test runs this
file on each): a prioritized buffer of 8 lanes of 8 rows; two writers write a step of 4
lanes at a time with ``add_each`` and a priority per row (one claims its lanes: the
native path writes them in one call; the other shares its lanes: row by row), three
learners sample and update (priorities of each row's own family, some near the bound
``largest_leaf``). Writers and learners get SIGKILLs and real SIGINTs at random
instants and at chosen points: of a write (inside add_each, between its rows and
inside one) and of a tree change (the lock held, the version odd: before anything
changed, the leaves set and their ancestors not, all done). Killed ones are replaced,
interrupted ones go on. A round also claims a lane of the sharing writer from this
process: its next step must be refused whole.

Then, every process stopped: (A) a learner holds a sample while a writer overwrites
every slot; its update applies to no row. (B) A writer stops for good inside the write
that overwrites the one row with most of the mass, and is SIGKILLed there.

Checked after the rounds, after (A) and after (B), slot by slot: every row held is
whole, a row of a step that was started, no row twice; every row an add_each reported
written is held, unless its lane's window has passed it; the trees hold a leaf for each
row held (of its own family: no update landed on another row) and for no other slot,
their inner nodes are exact, their total is the held rows' mass; a sample returns within
its timeout. Learners saw no torn row."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import random
import signal
import time

import numpy as np

import shmbuf
from shmbuf.core import ring
from shmbuf.priority import trees
from helpers import (ALPHA, STORM, check_trees, each_writer, family, held_rows, prio_storm_learner, read_events,
                     storm_torn, wait_for_file)

CTX = mp.get_context("fork")
CAPACITY, LANES, BATCH = 64, 8, 8
GROUPS = {0: ([0, 1, 2, 3], True), 1: ([4, 5, 6, 7], False)}  # group: (its lanes, claimed)
# chosen rounds: ("writer", group, "point@k@step") or ("learner", point), and the signal; "refuse"
CHOSEN = [("writer", 0, "writing@6@8", "SIGKILL"), ("learner", "changing", "SIGKILL"),
          ("writer", 1, "locked@2", "SIGKILL"), ("learner", "leaves", "SIGKILL"), ("refuse",),
          ("writer", 0, "writing@2@8", "SIGINT"), ("learner", "changed", "SIGINT"),
          ("writer", 1, "writing@6@8", "SIGINT"), ("learner", "leaves", "SIGINT"),
          ("writer", 1, "reserved@3", "SIGKILL"), ("learner", "changed", "SIGKILL")]


def check(buf, wlogs: dict, lanes_of: dict) -> dict:
    """What the buffer holds now, against the writers' logs (see the module); a sample
    first (it syncs the trees)."""
    try:
        sample_torn = storm_torn(buf.sample(256, timeout=5.0))
    except shmbuf.SampleTimeout:
        sample_torn = "stuck"
    held = held_rows(buf)
    t = buf.engine.priorities
    lo, _ = buf.engine.window()
    out = {"torn": int((~held["whole"]).sum()), "twice": len(held["key"]) - len(np.unique(held["key"])),
           "sample_torn": sample_torn}
    started = {w: max([int(e[1]) for e in read_events(path) if e[0] == "B"], default=-1) for w, path in wlogs.items()}
    w, step, j = held["key"] // 10**9, held["key"] % 10**9 // 16, held["key"] % 16
    out["unknown"] = sum(1 for k in range(len(w)) if not (
        int(w[k]) in lanes_of and step[k] <= started[int(w[k])] and j[k] < len(lanes_of[int(w[k])])
        and lanes_of[int(w[k])][int(j[k])] == held["lane"][k]))
    at = {(int(a), int(b)): int(k) for a, b, k in zip(held["lane"], held["seq"], held["key"])}
    missing = 0
    for wr, path in wlogs.items():
        for e in read_events(path):
            if e[0] == "W":
                for jj, seq in enumerate(map(int, e[2:])):
                    lane = lanes_of[wr][jj]
                    if seq >= lo[lane] and at.get((lane, seq)) != wr * 10**9 + int(e[1]) * 16 + jj:
                        missing += 1
    out["missing"] = missing
    check_trees(t)
    leaf = t.sum[t.leaves:t.leaves + t.capacity]
    mine = leaf[held["slot"]]
    fam = family(held["key"], CAPACITY) ** ALPHA
    own = np.isclose(fam, mine[:, None], rtol=1e-12, atol=0).any(axis=1)
    out["not_their_leaf"] = int((~own | (t.seq[held["slot"]] != held["seq"] + 1)).sum())
    others = np.setdiff1d(np.arange(t.capacity), held["slot"])
    out["leaves_of_no_row"] = int((leaf[others] != 0).sum())
    out["total_off"] = not np.isclose(t.sum[1], mine.sum(), rtol=1e-9, atol=0)
    return out


def storm(name: str, tmp_path, rounds: int = 2 * len(CHOSEN)) -> dict:
    """Run the storm; what the checks found (see the module)."""
    rnd = random.Random(0)
    stop = str(tmp_path / "stop")
    writers, wlogs, lanes_of, learners, llogs = {}, {}, {}, {}, []
    got: dict = {}

    def start_writer(group: int, hang: str = "", path: str = stop, steps: int = -1, ghost: bool = False,
                     lanes=None, before: str = "") -> tuple[int, str]:
        w = len(wlogs)
        wlogs[w], lanes_of[w] = str(tmp_path / f"w{w}.log"), GROUPS[group][0] if lanes is None else lanes
        flag = str(tmp_path / f"wflag{w}")
        p = CTX.Process(target=each_writer, args=(name, w, lanes_of[w], lanes is None and GROUPS[group][1], wlogs[w],
                                                  path, CAPACITY, hang, flag, "", steps, ghost, before))
        p.start()
        writers[w] = (group, p)
        return w, flag

    def start_learner(hang: str = "", go: str = "", hold: bool = False, until: str = stop) -> tuple[int, str]:
        s = len(llogs)
        llogs.append(str(tmp_path / f"l{s}.log"))
        flag = str(tmp_path / f"lflag{s}")
        p = CTX.Process(target=prio_storm_learner, args=(name, llogs[s], until, BATCH, CAPACITY, hang, flag, go, hold))
        p.start()
        learners[s] = p
        return s, flag

    def kill_writer(w: int) -> None:
        group, p = writers.pop(w)
        p.kill()
        p.join(30)
        if group is not None:
            start_writer(group)

    def signal_one() -> None:  # (a SIGINT goes to processes whose handler is in: they made their log)
        who = [("w", w) for w, (g, p) in writers.items() if g is not None and p.is_alive() and os.path.exists(wlogs[w])]
        who += [("l", s) for s, p in learners.items() if p.is_alive() and os.path.exists(llogs[s])]
        if not who:
            return
        kind, i = rnd.choice(who)
        sig = rnd.choice(["SIGKILL", "SIGINT"])
        if sig == "SIGINT":
            os.kill((writers[i][1] if kind == "w" else learners[i]).pid, signal.SIGINT)
        elif kind == "w":
            kill_writer(i)
        else:
            learners.pop(i).kill()
            start_learner()

    def kill_the_rest():  # (a storm that fails leaves no process running)
        for p in [p for _, p in writers.values()] + list(learners.values()):
            if p.is_alive():
                p.kill()
                p.join(30)

    with shmbuf.Buffer.create(STORM, CAPACITY, lanes=LANES, name=name, priority=ALPHA, seed=0) as buf, \
            contextlib.ExitStack() as cleanup:
        cleanup.callback(kill_the_rest)
        for group in GROUPS:
            start_writer(group)
        for _ in range(3):
            start_learner()
        for r in range(rounds):
            chosen = CHOSEN[r % len(CHOSEN)]
            if chosen[0] == "writer":
                _, group, hang, sig = chosen
                old = writers.pop(next(w for w, (g, _) in writers.items() if g == group))[1]
                old.kill()  # (a SIGKILL at a random instant)
                old.join(30)
                w, flag = start_writer(group, hang)
                wait_for_file(flag, writers[w][1], f"a writer to stop at {hang!r}", timeout=120)
                if sig == "SIGKILL":
                    kill_writer(w)
                else:
                    os.kill(writers[w][1].pid, signal.SIGINT)
            elif chosen[0] == "learner":
                _, point, sig = chosen
                go = str(tmp_path / f"go-{r}")
                s, flag = start_learner(point, go)
                wait_for_file(flag, learners[s], f"a learner to stop at {point!r}", timeout=120)
                os.kill(learners[s].pid, getattr(signal, sig))
                if sig == "SIGKILL":
                    learners.pop(s).join(30)
                else:
                    open(go, "w").close()  # (Ctrl-C is held off in a tree change: raised once it is done)
            else:  # a lane of the sharing writer claimed here: its next step is refused whole
                w = next(w for w, (g, _) in writers.items() if g == 1)
                open(stop + ".refusing", "w").close()  # (the writer holds before its next step)

                def logged(kinds: str, at: int | None = None) -> list:
                    deadline = time.monotonic() + 120
                    while not (got_ := [e for e in read_events(wlogs[w]) if e[0] in kinds
                                        and (at is None or int(e[1]) == at)]):
                        assert time.monotonic() < deadline and writers[w][1].is_alive(), "the writer never came"
                        time.sleep(0.005)
                    return got_
                step = int(logged("H")[0][1])
                with shmbuf.Buffer.attach(name) as intruder:
                    intruder.claim_lane(GROUPS[1][0][2])
                    open(stop + ".claimed", "w").close()  # (its step begins after the claim)
                    after = logged("WIRP", step)
                    writers.pop(w)[1].kill()  # (nothing more written to its lanes while we look)
                    os.remove(stop + ".refusing")
                    os.remove(stop + ".claimed")
                    held = held_rows(buf, GROUPS[1][0])
                    got["refused"] = after[0][0]
                    got["refused_rows_held"] = int(np.isin(held["key"] // 16, w * 10**9 // 16 + step).sum())
                start_writer(1)
            for _ in range(2):  # random instants: a SIGKILL or a SIGINT, whatever they do
                time.sleep(rnd.uniform(0, 0.03))
                signal_one()
        open(stop, "w").close()
        for _, p in list(writers.values()) + [(None, p) for p in learners.values()]:
            p.join(120)
            assert p.exitcode == 0
        writers.clear()
        learners.clear()
        got["rounds"] = check(buf, wlogs, lanes_of)
        # (A) a learner holds a sample while every slot is overwritten: its update applies to none
        go = str(tmp_path / "go-A")
        s, flag = start_learner(go=go, hold=True, until=str(tmp_path / "never"))
        wait_for_file(flag, learners[s], "the learner to hold its sample", timeout=120)
        w, _ = start_writer(None, path=str(tmp_path / "never"), steps=CAPACITY // LANES, lanes=list(range(LANES)))
        writers[w][1].join(120)
        buf.sample(1)  # (synced: the new rows' leaves are in)
        open(go, "w").close()
        learners[s].join(120)
        got["stale_applied"] = [int(e[1]) for e in read_events(llogs[s]) if e[0] == "U"]
        got["A"] = check(buf, wlogs, lanes_of)
        # (B) a lap whose first row has most of the mass, synced; then the write over it stops for good
        synced, flag = str(tmp_path / "synced"), str(tmp_path / "ghost")
        w, flag = start_writer(None, "writing@1@8", str(tmp_path / "never"), ghost=True, lanes=list(range(LANES)),
                               before=synced)
        deadline = time.monotonic() + 120
        while not any(e[0] == "W" and e[1] == "7" for e in read_events(wlogs[w])):
            assert time.monotonic() < deadline and writers[w][1].is_alive(), "the writer never wrote its lap"
            time.sleep(0.005)
        buf.sample(1)
        open(synced, "w").close()
        wait_for_file(flag, writers[w][1], "the writer to stop inside the write over the heavy row", timeout=120)
        writers.pop(w)[1].kill()
        got["B"] = check(buf, wlogs, lanes_of)
    got["learners_torn"] = sum(int(e[1]) for path in llogs for e in read_events(path) if e[0] == "X")
    got["learners_timed_out"] = sum(1 for path in llogs for e in read_events(path) if e[0] == "T")
    got["applied"] = sum(int(e[1]) for path in llogs for e in read_events(path) if e[0] == "U")
    got["interrupted"] = sum(1 for path in wlogs.values() for e in read_events(path) if e[0] == "I")
    got["written"] = sum(1 for path in wlogs.values() for e in read_events(path) if e[0] == "W")
    return got


CLEAN = {"torn": 0, "twice": 0, "unknown": 0, "missing": 0, "not_their_leaf": 0, "leaves_of_no_row": 0,
         "total_off": False, "sample_torn": 0}


def test_storm_add_each_writers_and_priority_updates(name, tmp_path):
    got = storm(name, tmp_path)
    assert got["rounds"] == CLEAN and got["A"] == CLEAN and got["B"] == CLEAN, got
    assert got["refused"] == "R" and got["refused_rows_held"] == 0, got
    assert got["stale_applied"] == [0] and got["learners_torn"] == 0, got
    assert got["interrupted"] > 0 and got["written"] > 0 and got["applied"] > 0, got


def test_the_storm_sees_updates_land_on_other_rows_without_the_stale_check(name, tmp_path, monkeypatch):
    """With an update applied whatever row its slot holds now, the learner of (A) sets
    the leaves of the rows written over its sample: the storm sees it."""
    def unchecked(self, slots, seqs, p):
        self.set(slots, p ** self.alpha)
        return len(slots)
    monkeypatch.setattr(trees.Trees, "update", unchecked)  # (forked children inherit it)
    got = storm(name, tmp_path, rounds=1)
    assert got["stale_applied"] != [0] and got["A"]["not_their_leaf"] > 0, got


def test_the_storm_sees_a_step_half_written_without_add_each_refusing_first(name, tmp_path, monkeypatch):
    """With add_each writing row by row before it looks for a lane claimed by another
    process, the step refused in the round that claims one is half written: the storm
    sees it."""
    monkeypatch.setattr(ring.Ring, "refuse_theirs", lambda self, lanes: None)  # (forked children inherit it)
    got = storm(name, tmp_path, rounds=CHOSEN.index(("refuse",)) + 1)
    assert got["refused"] == "P" and got["refused_rows_held"] > 0, got
