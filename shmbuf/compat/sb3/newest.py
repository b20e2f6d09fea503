"""The newest step of each env, sampled at once with ``optimize_memory_usage`` (as SB3's).

With ``optimize_memory_usage`` the facade keeps each env's steps as episodes (an
:class:`shmbuf.EpisodeBuffer`): a step's next observation is the next row of its lane, so
the newest step of an episode in progress would wait for the next ``add`` before it could
be sampled. SB3's buffer writes the next observation with the step (into the next slot),
and samples the newest transition at once. Here each lane keeps its newest step's next
observation in a slot of a region of the segment (``sb3.next``), written by the lane's
writer after the step's row, under a version word (odd while it is written: the seqlock
of :mod:`shmbuf.core.seqlock`); a slot counts while its step is still its lane's newest
row. A sample is then uniform over the buffer's transitions and those newest steps: how
many of each is drawn from the binomial of their counts, the newest ones are read with
the checked gather (their step rows) and the seqlock (their next observations), and the
batch is shuffled.

A slot whose writer was killed in the middle stays odd, and its step is not sampled until
the lane's next writer writes it again (a step left in the slot by a writer that stopped
adding, or whose env was reset, keeps its next observation: its transition is whole). A
restore (``load_state_dict``, a pickled copy) renumbers the rows, so no slot counts until
the next ``add``.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from shmbuf.core.batch import count
from shmbuf.core.segment import FormatError
from shmbuf.episodes.rows import FINAL, TERMINATED, TRUNCATED

REGION = "sb3.next"
HEAD = 16  # bytes of a slot before its observations: version, after (its step's row + 1; 0: none)


def _align8(n: int) -> int:
    return -(-n // 8) * 8


def slot_bytes(observations: dict[str, tuple[tuple[int, ...], Any]]) -> int:
    """Bytes of one lane's slot for observation fields ``{name: (shape, dtype)}``."""
    return HEAD + sum(_align8(np.dtype(d).itemsize * int(np.prod(s, dtype=np.int64))) for s, d in observations.values())


def region_bytes(observations: dict[str, tuple[tuple[int, ...], Any]], lanes: int) -> int:
    """Bytes of the region for ``lanes`` lanes."""
    return lanes * slot_bytes(observations)


def regions(fields: dict[str, Any], observations: list[str], lanes: int, at_once: bool) -> dict[str, int] | None:
    """The region of a new episodic buffer whose newest steps are sampled ``at_once``
    (an SB3 ``ReplayBuffer``'s with ``optimize_memory_usage``; not HER's, as SB3's HER
    samples finished episodes only, nor an ``NStepReplayBuffer``'s, whose windows stop at
    each env's newest row: see :mod:`shmbuf.compat.sb3.nstep`); ``fields``: the buffer's
    ``{name: (shape, dtype)}``, ``observations`` the names of its observation fields."""
    return {REGION: region_bytes({o: fields[o] for o in observations}, lanes)} if at_once else None


def part(core: Any) -> "Newest | NoNewest":
    """The part of a facade's handle on ``core`` (an EpisodeBuffer, or a Buffer): a
    :class:`Newest` if its segment has the region, else a :class:`NoNewest`."""
    return Newest(core) if REGION in core.engine.layout.regions else NoNewest()


class NoNewest:
    """A buffer without the region: nothing to keep, samples as they are."""

    def put(self, lanes: Any, step: Any, ended: Any) -> None:
        pass

    def sample(self, core: Any, n: int, timeout: float | None) -> dict[str, np.ndarray]:
        return core.sample(n, timeout=timeout)


class Newest:
    """Views on a buffer's ``sb3.next`` region: each lane's newest step (``after``: its
    row's sequence number + 1, the lane's head right after it; 0, as a new or restored
    segment's zeros say: none) and that step's next observations."""

    def __init__(self, ebuf: Any) -> None:
        engine = ebuf.engine
        layout, mem = engine.layout, engine.seg.mmap
        fields = {name: ebuf.user_fields[name] for name in ebuf.observations}
        off, size = layout.regions[REGION]
        width = slot_bytes(fields)
        if size != layout.lanes * width:
            raise FormatError(f"buffer {engine.name!r}: its {REGION!r} region holds {size} bytes, not the "
                              f"{layout.lanes * width} its {layout.lanes} lanes' observations need")
        self.ebuf, self.engine, self.lanes = ebuf, engine, layout.lanes
        words = np.ndarray((layout.lanes, width // 8), np.int64, mem, off)
        self.version, self.after = words[:, 0], words[:, 1]
        self.obs: dict[str, np.ndarray] = {}
        at = off + HEAD
        for name, (shape, dtype) in fields.items():
            dtype = np.dtype(dtype)
            strides = tuple(int(np.prod(shape[i + 1:], dtype=np.int64)) * dtype.itemsize for i in range(len(shape)))
            self.obs[name] = np.ndarray((layout.lanes,) + tuple(shape), dtype, mem, at, (width,) + strides)
            at += _align8(dtype.itemsize * int(np.prod(shape, dtype=np.int64)))
        self.fields = [(f.name, f.shape, f.dtype) for f in layout.fields]

    # -- the writer of the lanes -----------------------------------------------------

    def put(self, lanes: list[int], step: dict[str, np.ndarray], ended: np.ndarray) -> None:
        """After ``step`` of env ``i`` was written into lane ``lanes[i]`` (this process's):
        its next observation (``step["next_<obs>"][i]``), unless its episode ``ended``
        there (the final row holds it)."""
        heads = self.engine.heads()
        for i, lane in enumerate(lanes):
            v = int(self.version[lane])
            odd = v + 1 if v % 2 == 0 else v + 2  # (odd, whatever a killed writer left)
            self.version[lane] = odd
            if ended[i]:
                self.after[lane] = 0
            else:
                for name, view in self.obs.items():
                    view[lane] = step["next_" + name][i]
                self.after[lane] = heads[lane]
            self.version[lane] = odd + 1

    # -- samplers --------------------------------------------------------------------

    def _counting(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The lanes whose slot counts now, their steps and versions: a slot written
        (even version) for its lane's newest row, inside the lane's window."""
        version, after = self.version.copy(), self.after.copy()
        lo, head = self.engine.window()
        ok = (version % 2 == 0) & (after > lo) & (after == head)
        return np.flatnonzero(ok), after[ok] - 1, version[ok]

    def sample(self, core: Any, n: int, timeout: float | None) -> dict[str, np.ndarray]:
        """``n`` one-step transitions of the episode buffer ``core``, uniformly over its
        own and the newest steps that count (see the module), as its ``sample`` returns
        them (through its rate gate and counters)."""
        n = count(n, "batch_size")
        return self.engine.sample(n, n, timeout, lambda t: self._sample(n, t))

    def _sample(self, n: int, timeout: float) -> dict[str, np.ndarray]:
        ebuf, rng = self.ebuf, self.engine.rng
        transitions = ebuf.transitions
        deadline = time.monotonic() + timeout
        while True:
            lanes, steps, versions = self._counting()
            if len(lanes) == 0:
                return transitions.sample(n, 1, 0.99, None, max(0.0, deadline - time.monotonic()))
            total = ebuf.transition_count
            k = n if total <= 0 else int(rng.binomial(n, len(lanes) / (total + len(lanes))))
            got = self._read(lanes, steps, versions, rng.integers(len(lanes), size=k))
            if got is not None:
                break
            if time.monotonic() >= deadline:  # (a writer rewrote the slots under every try)
                got = {}
                k = 0
                break
        if k == n:
            return got
        rest = transitions.sample(n - k, 1, 0.99, None, max(0.0, deadline - time.monotonic()))
        if k == 0:
            return rest
        order = rng.permutation(n)
        return {name: np.concatenate([rest[name], got[name]])[order] for name in rest}

    def _read(self, lanes: np.ndarray, steps: np.ndarray, versions: np.ndarray,
              pick: np.ndarray) -> dict[str, np.ndarray] | None:
        """The transitions of the newest steps ``pick`` (indices into ``lanes``): their
        rows by the checked gather, their next observations from the slots; None if a
        slot changed or a row is not intact (the caller draws again)."""
        k = len(pick)
        rows = {name: np.empty((k,) + tuple(shape), dtype) for name, shape, dtype in self.fields}
        if k == 0:
            return self._transitions(rows, {}, k)
        lane, seq = lanes[pick], steps[pick]
        nexts = {name: view[lane] for name, view in self.obs.items()}  # (copies)
        if not (self.version[lane] == versions[pick]).all():
            return None
        torn = self.engine.gather(lane, seq, 1, list(rows.values()))  # (None: every row intact)
        if torn is not None or (rows["_flags"] & (FINAL | TERMINATED | TRUNCATED)).any():
            return None
        return self._transitions(rows, nexts, k)

    def _transitions(self, rows: dict[str, np.ndarray], nexts: dict[str, np.ndarray], k: int) -> dict[str, np.ndarray]:
        ebuf = self.ebuf
        out = {name: rows[name] for name in ebuf.user_fields}
        for name in ebuf.observations:
            out["next_" + name] = nexts[name] if k else rows[name]
        out["terminated"], out["truncated"] = np.zeros(k, bool), np.zeros(k, bool)
        return out


__all__ = ["REGION", "Newest", "NoNewest", "part", "region_bytes", "regions", "slot_bytes"]
