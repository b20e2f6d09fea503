"""One-step and n-step transitions out of an episode buffer, torn-read proof.

A transition is a step row whose next row in the lane belongs to the same episode (the
next step, or the final row). Candidates are drawn uniformly over pairs of adjacent
rows (the core's windows of 2), so rejecting the pairs that are not transitions (a
final row first, or two episodes) leaves a uniform draw over transitions. Every row a
transition reads (the step, the rows an n-step return adds up, the one holding the next
observation) is copied with the core's stamp check; a torn or unpublished row rejects
the candidate, which is drawn again.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from shmbuf.core import gather as core_gather, pool
from shmbuf.core.read import Sampler, read
from shmbuf.priority.trees import check_beta
from shmbuf.episodes import gather
from shmbuf.episodes.rows import FINAL, TERMINATED, TRUNCATED
from shmbuf.episodes.parts import Episodes


_ROUNDS_BEFORE_SCAN = 8
NONE_YET = ("the buffer holds no transition yet: an episode's step becomes one once its next step "
             "or its end is written")


class Transitions:
    """The episode buffer's sampler of transitions, uniformly (the shape of
    :mod:`shmbuf.samplers`' samplers, over transitions). It keeps its plans (per
    n-step and relabelling) and the fraction of candidates it last saw rejected (it
    draws that many more)."""

    def __init__(self, ebuf: Episodes) -> None:
        self.ebuf = ebuf
        self.plans: dict[tuple[int, bool], _Reads] = {}
        self.rejected = 0.0

    def check(self, n_step: int, beta: Any) -> None:
        """Raise the ``ValueError`` of arguments this sampler does not take (before the
        rate gate lets the call through: a refused call changes nothing)."""
        if beta is not None:
            raise ValueError("beta= is for a prioritized buffer: create it with priority=<exponent>")

    def sample(self, n: int, n_step: int, gamma: float, beta: Any, timeout: float) -> dict[str, np.ndarray]:
        return sample(self.ebuf, n, n_step, gamma, timeout)

    def update(self, index: Any, priorities: Any, timeout: float) -> int:
        return self.ebuf.core.sampler.update(index, priorities, timeout)


class ByPriority(Transitions):
    """Transitions drawn by the priority of their step (a buffer made with ``priority=``)."""

    def check(self, n_step: int, beta: Any) -> None:
        check_beta(beta)

    def sample(self, n: int, n_step: int, gamma: float, beta: Any, timeout: float) -> dict[str, np.ndarray]:
        return sample_by_priority(self.ebuf, n, n_step, gamma, check_beta(beta), timeout)


class Relabelled(Transitions):
    """One-step transitions, a fraction relabelled by the handle's :class:`shmbuf.HER`."""

    def __init__(self, ebuf: Episodes, her: Any) -> None:
        super().__init__(ebuf)
        self.her = her

    def check(self, n_step: int, beta: Any) -> None:
        super().check(n_step, beta)
        if n_step != 1:
            raise ValueError("hindsight relabelling is for one-step transitions: sample with n_step=1, or "
                             "set buf.her = None (an n-step return recomputed for a new goal would need "
                             "every step's reward recomputed)")

    def sample(self, n: int, n_step: int, gamma: float, beta: Any, timeout: float) -> dict[str, np.ndarray]:
        return self.her.relabel(self.ebuf, sample(self.ebuf, n, 1, gamma, timeout, where=True))


class _Reads:
    """What a handle's transition sampler reads, worked out once per ``n_step``: the
    output arrays, and which field goes where in the core's per-position gather."""

    def __init__(self, ebuf: Episodes, n_step: int, where: bool) -> None:
        k = ebuf.frame_stack
        self.n, self.k, self.reward, self.where = n_step, k, ebuf.reward, where
        self.specs = [(name, ((k,) if k > 1 and name in ebuf.observations else ()) + shape, dtype)
                      for name, (shape, dtype) in ebuf.user_fields.items()]
        self.specs += [("next_" + o, shape, dtype) for o, shape, dtype in self.specs if o in ebuf.observations]
        self.specs += [("terminated", (), np.bool_), ("truncated", (), np.bool_)]
        if n_step > 1:
            self.specs.append(("steps", (), np.int64))
        if where:  # where each transition's step is: its lane, row and episode's first row
            self.specs += [("_lane", (), np.int64), ("_seq", (), np.int64), ("_start", (), np.int64)]
        self.apart = ebuf.apart  # gathered on their own (frames to stack, large rows)
        self.obs = [o for o in ebuf.observations if o not in self.apart]
        index = ebuf.engine.ring.index
        self.width = len(index)
        self.first = [(index[name], name) for name in ebuf.user_fields if name not in self.apart]
        self.flags, self.start, self.reward_at = index["_flags"], index["_start"], index.get(ebuf.reward)
        self.next = [(index[o], "next_" + o) for o in self.obs]

    def discount(self, gamma: float) -> np.ndarray:
        """gamma ** j for the n steps, as a column."""
        if getattr(self, "_gamma", None) != gamma:
            self._gamma, self._powers = gamma, (gamma ** np.arange(self.n, dtype=np.float64))[:, None]
        return self._powers

    def empty(self, n: int) -> dict[str, np.ndarray]:
        return dict(zip([name for name, _, _ in self.specs],
                        pool.empty([((n,) + shape, dtype) for _, shape, dtype in self.specs])))


def sample(ebuf: Episodes, n: int, n_step: int, gamma: float,
           timeout: float, where: bool = False) -> dict[str, np.ndarray]:
    """``n`` transitions: the step's fields, ``next_<obs>``, ``terminated``, ``truncated``
    and, for ``n_step > 1``, ``steps`` (taken, <= n_step) with the discounted reward.
    With frame stacking, observations come as stacks ``(n, k, *frame)``. With
    ``where``, also where each step was read: ``_lane``, ``_seq`` (its row in the lane)
    and ``_start`` (its episode's first row), for samplers built on this one."""
    return read(uniformly(ebuf, n_step, gamma, where), n, timeout)


def uniformly(ebuf: Episodes, n_step: int, gamma: float, where: bool = False) -> Uniformly:
    """The read sampler of :func:`sample` (for samplers built on it)."""
    return Uniformly(ebuf, _plan(ebuf, n_step, where), gamma)


def _plan(ebuf: Episodes, n_step: int, where: bool) -> _Reads:
    plan = ebuf.transitions.plans.get((n_step, where))
    if plan is None:
        plan = ebuf.transitions.plans[n_step, where] = _Reads(ebuf, n_step, where)
    return plan


class Uniformly(Sampler):
    """Transitions uniformly, for :func:`~shmbuf.core.read.read`. A few more candidates
    than asked are drawn (about the fraction the handle's sampler last saw rejected:
    final rows, rows still waiting for their next observation), so that a second round
    is rare: the candidates that are transitions fill the positions, which in an i.i.d.
    stream of candidates are i.i.d. too."""

    what = "transitions"

    def __init__(self, ebuf: Episodes, plan: _Reads, gamma: float) -> None:
        self.ebuf, self.plan, self.gamma = ebuf, plan, gamma
        if plan.n > 1:
            self.hint = (f": with n_step={plan.n}, the newest steps of an episode in progress wait until "
                         f"{plan.n} steps follow them or it ends")
        self.check = none_yet(ebuf)  # type: ignore[method-assign]
        self.asked = 0

    def empty(self, m: int) -> dict[str, np.ndarray]:
        return self.plan.empty(m)

    def spare(self, m: int, rounds: int) -> int:
        return int(m * self.ebuf.transitions.rejected) + 4 if rounds == 0 else m + 4

    def draw(self, todo: np.ndarray, rounds: int, deadline: float) -> Any:
        self.asked = len(todo) if rounds == 0 else 0
        return draw_pairs(self.ebuf, len(todo) + self.spare(len(todo), rounds))

    def gather(self, drawn: Any, out: dict[str, np.ndarray]) -> np.ndarray | None:
        valid = copy_transitions(self.ebuf, self.plan, out, self.gamma, drawn)
        if self.asked and valid is not None and not valid[:self.asked].all():  # (what the next call draws more)
            self.ebuf.transitions.rejected = min(1.5 * (1.0 - np.count_nonzero(valid) / len(valid)), 1.0)
        return valid


def draw_pairs(ebuf: Episodes, m: int) -> tuple[Any, np.ndarray]:
    """The lanes and first rows of ``m`` pairs of adjacent rows, uniformly (the pairs
    that are not transitions are rejected by the gather)."""
    ring = ebuf.engine.ring
    try:
        lane, t, _ = core_gather.draw_windows(ring, ebuf.engine.rng, m, 2, None)
    except ValueError:
        if ring.size() == 0:
            raise  # "empty buffer"
        raise ValueError(NONE_YET) from None  # no lane holds two rows
    return lane, t


def copy_transitions(ebuf: Episodes, plan: _Reads, out: dict[str, np.ndarray], gamma: float,
          drawn: tuple[Any, np.ndarray]) -> np.ndarray | None:
    """Copy the transitions whose steps are ``drawn`` (lanes, rows) into ``out``; the
    mask of those that are intact transitions (None: all)."""
    ring = ebuf.engine.ring
    m, n, k = len(out["terminated"]), plan.n, plan.k
    lane, t = drawn
    # 1. Rows t .. t+n, one window per candidate, each position into arrays of its own:
    #    row t's fields straight into the output, then what the rows after it are read
    #    for (the large observations apart: 2.). The gather's filters keep rows of t's
    #    episode only, and no window starting at a final row.
    fl = np.empty(m, np.uint8)
    first: list = [None] * plan.width
    for i, name in plan.first:
        first[i] = out[name]
    first[plan.flags] = fl
    if plan.where:
        out["_lane"][:], out["_seq"][:] = lane, t
        first[plan.start] = out["_start"]
    if k > 1:
        if first[plan.start] is None:
            first[plan.start] = np.empty(m, np.int64)
        start = first[plan.start]
    if n == 1:
        after: list = [None] * plan.width
        for i, name in plan.next:
            after[i] = out[name]
        ok = core_gather.copy_windows(ring, lane, t, 2, None, [first, after], False, "_start", ("_flags", FINAL))
        valid = None if ok is None else ok.copy()
        steps, last = 1, fl
    elif ring.native is not None:  # n steps, summed in one native call
        rew = out[plan.reward]
        nxt: list = [None] * plan.width
        for i, name in plan.next:
            nxt[i] = out[name]
        steps, total, last = out["steps"], np.empty(m), fl
        first[plan.flags] = None
        ok = ring.native.reduce_windows(t, lane, n, gamma, plan.start, plan.flags, TERMINATED | TRUNCATED,
                                        FINAL, plan.reward_at, first, nxt, steps, total, last)
        valid = None if ok is None else np.frombuffer(ok, np.bool_).copy()
        rew[:] = total
    else:
        valid, steps, last = _n_step_python(plan, ring, lane, t, first, fl, out, gamma)
    # the flags of a step (not a final row) are 0, TERMINATED (1) or TRUNCATED (2):
    np.bitwise_and(last, TERMINATED, out=out["terminated"].view(np.uint8))
    np.right_shift(last, 1, out=out["truncated"].view(np.uint8))  # (candidates rejected: garbage)
    # 2. The large observations: frame stacks, or the rows t and t+steps alone
    if plan.apart:
        valid = np.ones(m, bool) if valid is None else valid
        if type(lane) is not np.ndarray:  # a one-lane ring
            lane = np.full(m, lane, np.int64)
        if k > 1:
            valid &= gather.stacks(ring, lane, t, start, k, {o: out[o] for o in plan.apart})
            valid &= gather.stacks(ring, lane, t + steps, start, k, {o: out["next_" + o] for o in plan.apart})
        else:
            valid &= gather.rows(ring, lane, t, {o: out[o] for o in plan.apart})
            valid &= gather.rows(ring, lane, t + steps, {o: out["next_" + o] for o in plan.apart})
    return valid


def sample_by_priority(ebuf: Episodes, n: int, n_step: int, gamma: float, beta: float,
                       timeout: float) -> dict[str, np.ndarray]:
    """``n`` transitions drawn by the priority of their step (see :mod:`shmbuf.priority.trees`:
    final rows have none; a drawn step that is not a transition yet, the newest of an
    episode in progress, is drawn again), with ``weight`` and ``index``."""
    draws = PriorityDraws(ebuf, _plan(ebuf, n_step, False), gamma, timeout)
    out = read(draws, n, timeout)
    out["weight"] = np.power(draws.low / out.pop("_p"), beta)
    out["index"] = np.stack([out.pop("_slot"), out.pop("_seq")], axis=1)
    return out


class PriorityDraws(Uniformly):
    """Transitions drawn by the priority of their step, for :func:`~shmbuf.core.read.read`,
    each with its slot, row and leaf (the private ``_slot``, ``_seq``, ``_p``); ``low``:
    the smallest leaf of every version of the trees drawn from."""

    what = "transitions by priority"
    hint = ""

    def __init__(self, ebuf: Episodes, plan: _Reads, gamma: float, timeout: float) -> None:
        super().__init__(ebuf, plan, gamma)
        self.hint, self.timeout, self.low = "", timeout, np.inf
        self.trees = ebuf.engine.priorities

    def empty(self, m: int) -> dict[str, np.ndarray]:
        out = self.plan.empty(m)
        out.update(_slot=np.empty(m, np.int64), _seq=np.empty(m, np.int64), _p=np.empty(m))
        return out

    def spare(self, m: int, rounds: int) -> int:
        return 0

    def draw(self, todo: np.ndarray, rounds: int, deadline: float) -> Any:
        slots, p, seq, least, ok = self.trees.pick(self.ebuf.engine.rng, len(todo), deadline, self.timeout)
        self.low = min(self.low, least)
        return slots, p, seq, ok

    def gather(self, drawn: Any, out: dict[str, np.ndarray]) -> np.ndarray | None:
        slots, p, seq, ok = drawn
        out["_slot"][:], out["_seq"][:], out["_p"][:] = slots, seq, p
        valid = copy_transitions(self.ebuf, self.plan, out, self.gamma, (slots // self.trees.lc, seq))
        return ok if valid is None else ok & valid


def _n_step_python(plan: _Reads, ring: Any, lane: Any, t: np.ndarray, first: list, fl: np.ndarray,
                   out: dict[str, np.ndarray], gamma: float) -> tuple[np.ndarray | None, np.ndarray, np.ndarray]:
    """The pure-Python path of the native ``reduce_windows``: rows t .. t+n in one
    window per candidate (each row checked on its own), then the steps taken, their
    discounted rewards and the next observations with numpy. Returns (validity or None
    for all, steps, flags of the last step taken)."""
    n, m = plan.n, len(t)
    # position j of the window is row t+j: flags[j], rews[j] (row t's too), obs
    rew = out[plan.reward]
    flags = np.empty((n + 1, m), np.uint8)
    rews = np.zeros((n + 1, m), rew.dtype)
    scratch = pool.empty([((n,) + out[name].shape, out[name].dtype) for _, name in plan.next])
    nobs = [(i, name, a) for (i, name), a in zip(plan.next, scratch)]
    first[plan.flags], first[plan.reward_at] = flags[0], rews[0]
    positions = [first]
    for j in range(1, n + 1):
        pos: list = [None] * plan.width
        for i, _, a in nobs:
            pos[i] = a[j - 1]
        pos[plan.flags], pos[plan.reward_at] = flags[j], rews[j]  # (the reward wins, if an observation too)
        positions.append(pos)
    ok = core_gather.copy_windows(ring, lane, t, n + 1, None, positions, True, "_start", ("_flags", FINAL))
    for i, _, a in nobs:
        if i == plan.reward_at:  # the reward is an observation field too: its next values
            a[:] = rews[1:].reshape(a.shape)
    fl[:] = flags[0]
    # the common case: no end among rows t .. t+n-2, every row intact: n steps
    early = np.bitwise_or.reduce(flags[:n - 1], axis=0) & (TERMINATED | TRUNCATED)
    rew[:] = plan.discount(gamma)[:, 0] @ rews[:n]
    out["steps"][:] = n
    last = flags[n - 1]
    for _, name, a in nobs:
        out[name][:] = a[n - 1]
    other = np.flatnonzero(early if ok is None else early | ~ok.all(axis=1))
    valid = None
    if len(other):  # the others: an episode that ends sooner, rows not intact
        valid = np.ones(m, bool)
        valid[other], last = _n_step(plan, out, flags[:, other], rews[:, other], ok, other, nobs, gamma, last)
    return valid, out["steps"], last


def _n_step(plan: _Reads, out: dict[str, np.ndarray], flags: np.ndarray, rews: np.ndarray,
            ok: np.ndarray | None, which: np.ndarray, nobs: list, gamma: float,
            last: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The n-step transitions of the candidates ``which`` in full: their steps (up to
    their episode's last step), rewards and next observations into ``out``. Returns
    their validity (rows t .. t+steps intact rows of t's episode) and the flags of the
    last step taken of every candidate."""
    n, m = plan.n, len(which)
    ends = np.empty((n, m), bool)  # row t+j is the episode's last step (or the n-th)
    np.not_equal(flags[:n - 1] & (TERMINATED | TRUNCATED), 0, out=ends[:n - 1])
    ends[n - 1] = True
    steps = ends.argmax(axis=0) + 1
    cols = np.arange(m)
    last = last.copy()
    last[which] = flags[steps - 1, cols]
    valid = np.ones(m, bool) if ok is None else np.logical_and.accumulate(ok[which], axis=1)[cols, steps]
    taken = np.arange(n)[:, None] < steps  # (n, m): the rewards of rows t .. t+steps-1
    out[plan.reward][which] = (np.where(taken, rews[:n], 0) * plan.discount(gamma)).sum(axis=0)
    out["steps"][which] = steps
    for _, name, a in nobs:
        out[name][which] = a[steps - 1, which]
    return valid, last


def none_yet(ebuf: Episodes) -> Any:
    """The ``check`` of :class:`shmbuf.core.read.Sampler` for samplers of
    transitions: after a few redraws, raise ``ValueError(NONE_YET)`` if an exact scan
    finds no transition at all."""
    def check(rounds: int) -> None:
        if rounds > _ROUNDS_BEFORE_SCAN and not gather.any_transition(ebuf.engine.ring):
            raise ValueError(NONE_YET)
    return check
