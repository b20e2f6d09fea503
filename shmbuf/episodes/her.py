"""Hindsight experience replay (Andrychowicz et al. 2017) at sample time, on an
:class:`~shmbuf.EpisodeBuffer`: nothing extra is stored.

A sample of ``n`` transitions is drawn as usual; a fraction ``ratio`` of them (the
count rounded at random, so the expected fraction is exact) gets its desired goal
replaced by a goal the agent achieved later in the same episode, and its reward
recomputed by ``reward_fn(next_achieved, new_goal, {})``, once per batch. The goals
are the achieved goals *after a step* (row ``j`` of the episode holds the observation
after step ``j - 1``, the final row the one after the last step), as in
stable-baselines3's ``HerReplayBuffer``:

* ``future``: after a step at or after the sampled one, i.e. an observation strictly
  later than the sampled step's (rows ``t + 1 .. last``);
* ``final``: after the episode's last step (its final row);
* ``episode``: after any step of the episode (rows ``start + 1 .. last``), the ones
  already evicted left out.

For an episode still in progress, ``last`` is its newest row: goals come only from
steps already written, never from a future that has not happened. Each goal is read
with the torn-read check and the check that its row still belongs to the sampled
step's episode; a transition whose episode is evicted while it is being relabelled
(all of its candidate rows overwritten) keeps its own goal.

A function cannot live in shared memory, so a :class:`HER` belongs to a handle: the
creator passes it to ``create``, other processes to ``attach``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

from shmbuf.episodes import gather
from shmbuf.episodes.parts import Episodes


STRATEGIES = ("future", "final", "episode")
_ROUNDS = 4  # reads of a goal before a transition keeps its own (its episode is being evicted)


@dataclass(frozen=True)
class HER:
    """Relabel a fraction ``ratio`` of each sample with achieved goals (see the module).

    ``achieved`` names the observation field of the achieved goal (the buffer returns
    ``next_<achieved>`` for it), ``desired`` the field of the desired goal (of the same
    shape and dtype; an observation field or not: where it is, ``next_<desired>`` is
    relabelled too). ``reward_fn(achieved_goal, desired_goal, info)`` takes batches,
    ``(k, *goal_shape)`` each, and returns ``k`` rewards (gymnasium-robotics'
    ``env.unwrapped.compute_reward`` does); ``info`` is ``{}``, or what
    ``info_fn(lanes, seqs)`` returns for the relabelled transitions (their lanes and
    sequence numbers: a handle that kept its own infos passes them on).

    Examples:
        >>> import numpy as np, shmbuf
        >>> her = shmbuf.HER("future", ratio=1.0, reward_fn=lambda a, d, info: (a == d).all(-1) - 1.0)
        >>> buf = shmbuf.EpisodeBuffer.create(
        ...     {"obs": ((1,), "float32"), "achieved_goal": ((1,), "float32"),
        ...      "desired_goal": ((1,), "float32"), "reward": ((), "float32")}, 64, seed=0,
        ...     observations=["obs", "achieved_goal", "desired_goal"], her=her)
        >>> g = np.arange(4.0)[:, None]                  # the goal achieved at each observation
        >>> buf.add_episode({"obs": g[:3], "achieved_goal": g[:3], "desired_goal": np.full((3, 1), 9.0),
        ...                  "reward": [-1, -1, -1], "next_obs": g[3], "next_achieved_goal": g[3],
        ...                  "next_desired_goal": [9.0]})
        >>> b = buf.sample(100)
        >>> bool((b["desired_goal"] > b["obs"]).all())   # a strictly later observation's goal
        True
        >>> bool(((b["reward"] == 0) == (b["desired_goal"] == b["next_achieved_goal"])[:, 0]).all())
        True
        >>> buf.close()
    """

    strategy: str = "future"
    ratio: float = 0.8
    achieved: str = "achieved_goal"
    desired: str = "desired_goal"
    reward_fn: Callable[[np.ndarray, np.ndarray, Any], Any] | None = None
    info_fn: Callable[[np.ndarray, np.ndarray], Any] | None = None

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"HER strategy must be one of {STRATEGIES}, got {self.strategy!r}")
        if isinstance(self.ratio, bool) or not isinstance(self.ratio, (int, float, np.floating, np.integer)) \
                or not 0.0 <= float(self.ratio) <= 1.0:
            raise ValueError(f"HER ratio must be a number in [0, 1] (the fraction of a sample relabelled), "
                             f"got {self.ratio!r}")
        if not callable(self.reward_fn):
            raise TypeError("HER needs reward_fn(achieved_goal, desired_goal, info) -> rewards, to recompute "
                            f"the rewards of relabelled transitions; got {self.reward_fn!r}")

    def check(self, fields: Mapping[str, tuple[tuple[int, ...], Any]], observations: list[str],
              reward: str | None, frame_stack: int) -> None:
        """Raise ValueError unless this relabelling fits a buffer of these fields."""
        where = f"the buffer's fields are {list(fields)}, its observations {observations}"
        if self.achieved not in observations:
            raise ValueError(f"HER achieved={self.achieved!r} must name an observation field (its next_ "
                             f"value is the goal a step reached): {where}")
        if self.desired not in fields:
            raise ValueError(f"HER desired={self.desired!r} must name a field of the buffer: {where}")
        a, d = fields[self.achieved], fields[self.desired]
        if (tuple(a[0]), np.dtype(a[1])) != (tuple(d[0]), np.dtype(d[1])):
            raise ValueError(f"HER goals: {self.achieved!r} is {a[0]} {np.dtype(a[1])} but {self.desired!r} "
                             f"is {d[0]} {np.dtype(d[1])}; they must have the same shape and dtype")
        if reward is None:
            raise ValueError("HER recomputes rewards: create the buffer with reward=<field name>")
        if frame_stack != 1:
            raise ValueError("HER does not relabel stacked observations: use frame_stack=1")

    def relabel(self, ebuf: Episodes, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Relabel ``batch`` (drawn by the transition sampler with where each step is)
        in place; returns it without the position keys."""
        lane, seq, start = batch.pop("_lane"), batch.pop("_seq"), batch.pop("_start")
        rng = ebuf.engine.rng
        whole, frac = divmod(float(self.ratio) * len(seq), 1.0)
        k = int(whole) + (rng.random() < frac if frac else 0)
        if k == 0:
            return batch
        desired = batch[self.desired]
        kept = desired[:k].copy()  # (for a transition that gets no goal: rare)
        got = _goals(ebuf, self, lane[:k], seq[:k], start[:k], desired[:k])  # goals straight in
        if got.all():
            rows: Any = slice(0, k)
        else:
            rows = np.flatnonzero(got)
            desired[:k][~got] = kept[~got]
        goals = desired[rows]
        info = {} if self.info_fn is None else self.info_fn(lane[:k][rows], seq[:k][rows])
        rewards = np.asarray(self.reward_fn(batch["next_" + self.achieved][rows], goals, info))
        count = len(goals)
        if rewards.size != count:
            raise ValueError(f"HER reward_fn returned an array of shape {rewards.shape} for {count} "
                             f"transitions; it must return one reward per transition")
        batch[ebuf.reward][rows] = rewards.reshape(count)
        if "next_" + self.desired in batch:
            batch["next_" + self.desired][rows] = goals
        return batch


def _goals(ebuf: Episodes, her: HER, lane: np.ndarray, seq: np.ndarray, start: np.ndarray,
           out: np.ndarray) -> np.ndarray:
    """Draw a goal row for each transition (step ``seq`` of ``lane``, its episode
    starting at ``start``) and copy its achieved goal into ``out``. Returns the mask of
    the transitions that got one: a goal row that was not an intact row of the
    episode when copied (overwritten since the search) is drawn again, a few times."""
    ring, rng = ebuf.engine.ring, ebuf.engine.rng
    got = np.zeros(len(seq), bool)
    todo = slice(None)  # then the indices of the transitions still without a goal
    for _ in range(_ROUNDS):
        ln, s, t = lane[todo], start[todo], seq[todo]
        # the episode's last row (final, or newest published): row t + 1 is of it (the
        # transition's next row, read with the check)
        last = ebuf.episode_ends().last_rows(ln, t + 1, s)
        first = {"future": t + 1, "final": last}.get(her.strategy)
        if first is None:  # "episode": from its first step's next row on, the ones still there
            first = np.maximum(s + 1, ring.window()[0][ln])  # (above last: no row, nothing got)
        j = first + (rng.random(len(t)) * (last - first + 1)).astype(np.int64)
        goal = out[todo] if type(todo) is not slice else out
        row_start = np.empty(len(t), np.int64)
        ok = gather.rows(ring, ln, j, {her.achieved: goal, "_start": row_start})
        ok &= row_start == s
        if type(todo) is slice:
            if ok.all():
                return ok
            got[:] = ok
            todo = np.flatnonzero(~ok)
        else:
            out[todo[ok]] = goal[ok]
            got[todo[ok]] = True
            todo = todo[~ok]
            if not len(todo):
                break
    return got
