"""EpisodeBuffer: episodes in shared memory, written env by env into lanes."""

from __future__ import annotations

from contextlib import suppress
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from shmbuf.buffer.handle import DEFAULT_TIMEOUT, Buffer
from shmbuf.core.batch import count
from shmbuf.core.deadline import Deadline
from shmbuf.core.layout import normalize_fields
from shmbuf.ragged.schema import is_ragged
from shmbuf.priority.trees import check_beta
from shmbuf.episodes import gather, trajectories, transitions, whole
from shmbuf.episodes.rows import SYSTEM, VERSION, StepRows, plan
from shmbuf.episodes.counts import Counts
from shmbuf.episodes.writer import EpisodeWriter

KIND = "episodes"


class EpisodeBuffer(Counts):
    """A replay buffer of episodes: each env's steps go in order into a lane of their
    own, so an episode is contiguous; observations are stored once (see
    :mod:`shmbuf.episodes.rows`).

    Examples:
        >>> buf = EpisodeBuffer.create({"obs": ((2,), "float32"), "reward": ((), "float32")}, 16, seed=0)
        >>> buf.add_episode({"obs": np.zeros((3, 2)), "reward": [1, 2, 4], "next_obs": [9, 9]},
        ...                 terminated=True)
        >>> b = buf.sample(4, n_step=2, gamma=0.5)
        >>> set(b["reward"].tolist()) <= {2.0, 4.0}  # 1 + 0.5 * 2, 2 + 0.5 * 4, 4
        True
        >>> buf.close()
    """

    def __new__(cls, core: Any = None, *args: Any, **kwargs: Any) -> "EpisodeBuffer":
        """``EpisodeBuffer(fields, capacity, ...)`` is :meth:`create`, as ``Buffer(...)`` is;
        ``EpisodeBuffer(buffer)`` wraps an attached episode buffer's :class:`~shmbuf.Buffer`."""
        if isinstance(core, Mapping):
            return cls.create(core, *args, **kwargs)
        return super().__new__(cls)

    def __init__(self, core: Any, *args: Any, **kwargs: Any) -> None:
        if isinstance(core, Mapping):
            return  # (made by create, in __new__)
        if not isinstance(core, Buffer):
            raise TypeError(f"EpisodeBuffer(...) takes the fields and capacity of a new buffer (as "
                            f"EpisodeBuffer.create), or a shmbuf.Buffer to wrap; got {type(core).__name__}")
        self._wrap(core, *args, **kwargs)

    def _wrap(self, core: Buffer, her: Any = None) -> None:
        meta = core.engine.layout.meta  # (the library's: EpisodeBuffer.create's)
        if meta.get("kind") != KIND:
            raise ValueError(f"buffer {core.name!r} is not an episode buffer (it was made by "
                             "shmbuf.Buffer.create); attach it with shmbuf.Buffer.attach")
        self.core = core
        self.engine = core.engine
        self.observations: list[str] = list(meta["observations"])
        self.reward: str | None = meta.get("reward")
        self.frame_stack: int = int(meta.get("frame_stack", 1))
        self.step_rows = StepRows({k: v for k, v in core.fields.items() if k != VERSION}, self.observations)
        self.user_fields = {k: v for k, v in core.fields.items() if k not in SYSTEM}
        self._writer: EpisodeWriter | None = None
        self.transitions: transitions.Transitions = (  # the sampler of transitions (set again with her)
            transitions.ByPriority(self) if core.prioritized else transitions.Transitions(self))
        self.episode_index = whole.Index(core.lanes)  # sample_episodes' complete episodes
        # observation fields read apart from the rest of a row (not once per step of
        # an n-step window): frames to stack, and anything larger than a packed row
        packed = {f.name: f.packed for f in core.engine.layout.fields}
        self.apart = [o for o in self.observations if self.frame_stack > 1 or not packed[o]]
        self._her = None
        self.her = her
        self._ends: gather.Ends | None = None  # where ended episodes end (made on first use)

    @classmethod
    def create(cls, fields: Mapping[str, Any], capacity: int, *, lanes: int = 1,
               observations: Sequence[str] | None = None, reward: str | None = "reward",
               frame_stack: int = 1, her: Any = None, **kwargs: Any) -> "EpisodeBuffer":
        """Create an episode buffer of ``capacity`` rows over ``lanes`` lanes (one per env
        that writes at the same time). ``observations`` names the observation fields
        (default ``["obs"]``): steps take ``next_<name>`` for each, samples return it.
        ``reward`` names the field n-step returns and returns-to-go add up (the default
        ``"reward"`` is ignored if there is no such field). With ``frame_stack=k`` the
        observation fields hold single frames (add the newest frame of each step) and
        ``sample`` returns stacks ``(n, k, *frame)`` of the episode's ``k`` latest
        frames, zeros before its first step. ``her=shmbuf.HER(...)`` relabels samples
        with achieved goals (this handle's; see :attr:`her`). Other arguments (``meta``:
        yours, returned as given by ``core.meta``): as :meth:`shmbuf.Buffer.create`."""
        if "arena" in kwargs or (isinstance(fields, Mapping) and any(map(is_ragged, fields.values()))):
            raise ValueError("an EpisodeBuffer has no ragged fields (shaped (None, ...)) yet: keep them in a "
                             "shmbuf.Buffer (add/extend/sample/take), or give them a fixed shape here")
        if reward == "reward" and "reward" not in [f.name for f in normalize_fields(fields)]:
            reward = None
        if isinstance(frame_stack, bool) or not isinstance(frame_stack, (int, np.integer)) or frame_stack < 1:
            raise ValueError(f"frame_stack must be an int >= 1 (frames per stacked observation), got {frame_stack!r}")
        if kwargs.get("mode", "replay") != "replay":
            raise ValueError(f"an EpisodeBuffer is a replay buffer, got mode={kwargs['mode']!r}; for a queue of "
                             "unrolls use shmbuf.Buffer.create(..., mode='queue') with a time axis per field")
        if kwargs.get("sampler", "uniform") != "uniform" or kwargs.get("max_times_sampled") is not None:
            raise ValueError("sampler= and max_times_sampled= are for shmbuf.Buffer (an EpisodeBuffer samples "
                             "transitions, trajectories and episodes its own ways)")
        specs, observations = plan(fields, observations, reward)
        if her is not None:
            her.check(specs, observations, reward, int(frame_stack))
            if kwargs.get("priority") is not None:
                raise ValueError("hindsight relabelling of a prioritized buffer is not supported: pass "
                                 "her= or priority=, not both")
        library = {**kwargs.pop("_library", {}), "kind": KIND, "observations": observations, "reward": reward,
                   "frame_stack": int(frame_stack)}
        return cls(Buffer.create(specs, capacity, lanes=lanes, _library=library, **kwargs), her)

    @classmethod
    def attach(cls, name: str, *, seed: Any = None, timeout: float = DEFAULT_TIMEOUT,
               her: Any = None) -> "EpisodeBuffer":
        """Attach to an episode buffer by name (any process); ``her``: this handle's
        hindsight relabelling (a function cannot be shared, so each handle has its own)."""
        core = Buffer.attach(name, seed=seed, timeout=timeout)
        try:
            return cls(core, her)
        except BaseException:
            core.close()
            raise

    def save(self, path: Any, **kwargs: Any) -> dict[str, Any]:
        """Save into the directory ``path`` while writers keep writing (episodes in
        progress too); see :meth:`shmbuf.Buffer.save`."""
        return self.core.save(path, **kwargs)

    @classmethod
    def load(cls, path: Any, *, her: Any = None, **kwargs: Any) -> "EpisodeBuffer":
        """An episode buffer in shared memory from a :meth:`save` directory: the same
        episodes, lanes, order and episode numbers, so n-step results, trajectories and
        whole episodes are those of the saved buffer (with ``restore_rng=True``, the
        same samples). ``her``: this handle's relabelling. Other arguments: as
        :meth:`shmbuf.Buffer.load`.

        Examples:
            >>> import tempfile, os
            >>> tmp = tempfile.TemporaryDirectory(); d = os.path.join(tmp.name, "episodes")
            >>> buf = EpisodeBuffer.create({"obs": ((2,), "float32"), "reward": ((), "float32")}, 16)
            >>> buf.add_episode({"obs": np.zeros((3, 2)), "reward": [1, 2, 4], "next_obs": [9, 9]})
            >>> _ = buf.save(d)
            >>> copy = EpisodeBuffer.load(d, name=f"{buf.name}-copy")
            >>> copy.num_episodes, len(copy.sample_episodes(1)[0]["reward"])
            (1, 3)
            >>> buf.close(); copy.close(); tmp.cleanup()
        """
        from shmbuf.persist import save as persist

        kind = persist.read(path)["kind"]
        if kind != KIND:
            raise ValueError(f"{str(path)!r} holds a save of a {kind!r}, not of an episode buffer; "
                             "load it with shmbuf.Buffer.load")
        core = Buffer.load(path, **kwargs)
        try:
            return cls(core, her)
        except BaseException:
            core.unlink()
            core.close()
            raise

    @property
    def her(self) -> Any:
        """This handle's :class:`shmbuf.HER` relabelling of :meth:`sample`, or None.
        Set it (or None) at any time; it is checked against the buffer's fields."""
        return self._her

    @her.setter
    def her(self, her: Any) -> None:
        if her is not None:
            if not callable(getattr(her, "relabel", None)):
                raise TypeError(f"her must be a shmbuf.HER (or None), got {type(her).__name__}")
            her.check(self.user_fields, self.observations, self.reward, self.frame_stack)
            if self.core.prioritized:
                raise ValueError("hindsight relabelling of a prioritized buffer is not supported")
            self.transitions = transitions.Relabelled(self, her)
        elif self._her is not None:
            self.transitions = transitions.Transitions(self)
        self._her = her

    def episode_ends(self) -> "gather.Ends":
        if self._ends is None:
            self._ends = gather.Ends(self.engine.ring)
        return self._ends

    # -- writing ---------------------------------------------------------------------

    def writer(self, envs: int | None = None, *, timeout: float | None = None) -> EpisodeWriter:
        """A writer for ``envs`` environments (claims a lane for each; steps then take a
        leading env axis), or for one environment without that axis (``envs=None``)."""
        return EpisodeWriter(self, envs, timeout)

    def add(self, step: Mapping[str, Any], *, terminated: Any, truncated: Any,
            timeout: float | None = None, version: int | None = None) -> None:
        """Add one step of one env, through this handle's own one-env writer (which
        claims a lane at the first step that is written, and keeps none if that fails).
        ``version``: of a buffer created with ``versions=True`` (see :meth:`bind`)."""
        self._own("add", step, terminated=terminated, truncated=truncated, timeout=timeout, version=version)

    def add_episode(self, episode: Mapping[str, Any], *, terminated: bool = True,
                    timeout: float | None = None, version: int | None = None) -> None:
        """Write a whole episode; see :meth:`EpisodeWriter.add_episode`."""
        self._own("add_episode", episode, terminated=terminated, timeout=timeout, version=version)

    def _own(self, method: str, *args: Any, **kwargs: Any) -> None:
        """Call ``method`` of this handle's own writer; a writer made for this call claims
        its lane within the call's timeout, writes in what is left of it, and if that
        fails gives the lane back (a bad first step must not keep the only lane)."""
        if self._writer is not None:
            return getattr(self._writer, method)(*args, **kwargs)
        deadline = Deadline(self.engine.seconds(kwargs["timeout"]))
        writer = self._writer = EpisodeWriter(self, None, deadline.left())
        try:
            getattr(writer, method)(*args, **{**kwargs, "timeout": deadline.left()})
        except BaseException:
            with suppress(TimeoutError):  # (not given back in time: the writer keeps it, for the next add)
                self.release_lane(timeout=deadline.left())
            raise

    def own_writer(self) -> EpisodeWriter:
        if self._writer is None:
            self._writer = EpisodeWriter(self, None, None)
        return self._writer

    def release_lane(self, *, timeout: float | None = None) -> None:
        """Give back the lane this handle's own writer (:meth:`add`) claimed; the next
        :meth:`add` claims one again. A no-op without one."""
        if self._writer is not None:
            self._writer.close(timeout)  # (if it raises, the writer keeps what it did not release)
        self._writer = None

    # -- sampling --------------------------------------------------------------------

    def sample(self, n: int, *, n_step: int = 1, gamma: float = 0.99,
               timeout: float | None = None, beta: float | None = None) -> dict[str, np.ndarray]:
        """``n`` transitions, uniformly with replacement: each step's fields,
        ``next_<obs>`` (the next observation, or the real final one where the episode
        ended), ``terminated`` and ``truncated``. With ``n_step=k``: ``reward`` is the
        discounted sum over up to ``k`` steps, stopping at the episode's end,
        ``next_<obs>`` the observation after the last step taken, ``steps`` how many were
        taken, and the flags say how the episode ended within them. With :attr:`her`
        set, a fraction of the transitions come relabelled (one-step only). In a buffer
        created with ``priority=``, transitions are drawn by the priority of their step
        and come with ``weight`` (exponent ``beta``, default 0.4) and ``index`` for
        :meth:`update_priorities`, n-step ones included."""
        if type(n) is not int or n < 0:
            n = count(n, "n")
        if n_step != 1:
            n_step = count(n_step, "n_step", 1)
            if self.reward is None:
                raise ValueError("n-step returns need a reward field: create the buffer with reward=<field name>")
            if n_step + 1 > self.lane_capacity:
                raise ValueError(f"n_step={n_step} needs {n_step + 1} rows of a lane, more than it holds "
                                 f"({self.lane_capacity})")
            gamma = float(gamma)
        if timeout is not None:
            timeout = self.engine.seconds(timeout)  # checked now; None: the handle's, looked up if needed
        sampler = self.transitions
        sampler.check(n_step, beta)
        return self.engine.sample(n, n, timeout, lambda t: sampler.sample(n, n_step, gamma, beta, t))

    def update_priorities(self, index: Any, priorities: Any, *, timeout: float | None = None) -> int:
        """Set the priorities of sampled transitions (of their steps), from any process;
        see :meth:`shmbuf.Buffer.update_priorities`."""
        return self.transitions.update(index, priorities, self.engine.seconds(timeout))

    def sample_trajectories(self, batch: int, length: int, *, burn_in: int = 0,
                            beta: float | None = None,
                            timeout: float | None = None) -> dict[str, np.ndarray]:
        """``batch`` windows of ``length`` steps of one episode each, ending at a step
        drawn uniformly over transitions (d3rlpy's trajectory slicer): every field
        ``(batch, length, ...)`` (observations as stored: single frames with
        ``frame_stack``), front-padded with zeros where the episode (or what is left of
        it) is shorter, and ``mask`` (False on padding), ``timestep`` (1-based step in
        the episode, 0 on padding), ``returns_to_go`` (the rewards from each step to the
        episode's end; for an episode still in progress, to its newest step),
        ``terminated`` and ``truncated`` (on the episode's last step).

        ``burn_in=k`` (recurrent agents, R2D2): every array gets ``k`` more positions in
        front, the up to ``k`` steps of the same episode before the window (padding where
        the episode starts later), read with the same checks; ``burn_in_mask`` is True on
        the burn-in positions that hold a step. A recurrent state stored as a field comes
        back for every step: take it at the first burn-in step.

        In a buffer created with ``priority=``, the end step is drawn by its priority (a
        sequence's priority is its last step's), and the batch carries ``weight``
        (importance sampling with exponent ``beta``, default 0.4) and ``index`` for
        :meth:`update_priorities`, which then sets one priority per sequence.

        Examples:
            >>> buf = EpisodeBuffer.create({"obs": ((1,), "float32"), "reward": ((), "float32")}, 16, seed=0)
            >>> buf.add_episode({"obs": [[5]], "reward": [2], "next_obs": [6]})  # one step
            >>> t = buf.sample_trajectories(1, 3)
            >>> t["obs"][0, :, 0].tolist(), t["mask"][0].tolist(), t["returns_to_go"][0].tolist()
            ([0.0, 0.0, 5.0], [False, False, True], [0.0, 0.0, 2.0])
            >>> buf.close()
        """
        batch = count(batch, "batch")
        length = count(length, "length", 1)
        burn_in = count(burn_in, "burn_in")
        if self.core.prioritized:
            beta = check_beta(beta)
        elif beta is not None:
            raise ValueError("beta= is for a prioritized buffer: create it with priority=<exponent>")
        return self.engine.sample(batch, batch * (burn_in + length), timeout,
                                  lambda t: trajectories.sample(self, batch, length, t, burn_in=burn_in, beta=beta))

    def sample_episodes(self, n: int, *, timeout: float | None = None) -> list[dict[str, np.ndarray]]:
        """``n`` whole episodes, uniformly over the complete ones (ended, none of their
        rows evicted), with replacement: each a dict of ``(T, ...)`` arrays of the
        fields, ``next_<obs>``, ``terminated`` and ``truncated``, in step order even
        where the episode wraps around its lane. ValueError if there is none.

        Examples:
            >>> buf = EpisodeBuffer.create({"obs": ((1,), "float32"), "reward": ((), "float32")}, 16, seed=0)
            >>> buf.add_episode({"obs": [[0], [1]], "reward": [1, 2], "next_obs": [2]}, terminated=False)
            >>> ep = buf.sample_episodes(1)[0]
            >>> ep["next_obs"].ravel().tolist(), ep["truncated"].tolist()
            ([1.0, 2.0], [False, True])
            >>> buf.close()
        """
        n = count(n, "n")
        return self.engine.sample(n, n, timeout, lambda t: whole.sample(self, n, t))

    def episodes(self) -> Iterator[dict[str, np.ndarray]]:
        """Every complete episode held now (ended, first step not evicted), lane by lane,
        oldest first, each as :meth:`sample_episodes` returns one; episodes evicted while
        the iteration runs are skipped. Writers may keep writing meanwhile.

        Examples:
            >>> buf = EpisodeBuffer.create({"obs": ((1,), "float32")}, 16)
            >>> for t in (2, 3):
            ...     buf.add_episode({"obs": np.zeros((t, 1)), "next_obs": [1]})
            >>> [len(e["obs"]) for e in buf.episodes()]
            [2, 3]
            >>> buf.close()
        """
        return whole.every(self)

    def sample_sequences(self, batch: int, length: int, **kwargs: Any) -> dict[str, np.ndarray]:
        """Windows of consecutive rows of a lane that may cross episodes (as the core's),
        system fields and final rows included."""
        return self.core.sample_sequences(batch, length, **kwargs)

    # -- versions --------------------------------------------------------------------

    @property
    def versioned(self) -> bool:
        """True for a buffer created with ``versions=True`` (see :meth:`bind`)."""
        return self.core.versioned

    def bind(self, source: Any) -> None:
        """Steps this handle's writers write without ``version=`` get ``source.version``
        (an Actor's or a Weights'): see :meth:`shmbuf.Buffer.bind`."""
        self.core.bind(source)

    # -- the rest --------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self.core.name

    @property
    def capacity(self) -> int:
        return self.core.capacity

    @property
    def lane_capacity(self) -> int:
        return self.core.lane_capacity

    @property
    def nbytes(self) -> int:
        """Bytes of shared memory the buffer takes."""
        return self.core.nbytes

    @property
    def fields(self) -> dict[str, Any]:
        """The user's fields (without the system fields): ``{name: (shape, dtype)}``, the
        observation fields as stored (single frames with ``frame_stack``)."""
        return dict(self.user_fields)

    def flush(self, *, timeout: float | None = None) -> None:
        """A durability point of an episode buffer in a file: see :meth:`shmbuf.Buffer.flush`."""
        self.core.flush(timeout=timeout)

    def unlink(self) -> None:
        """Destroy the buffer's name (or file) now: see :meth:`shmbuf.Buffer.unlink`."""
        self.core.unlink()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        self.core.close()

    def __enter__(self) -> "EpisodeBuffer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickles as its name, like a core Buffer: unpickling attaches (in any process,
        any start method); writers are not carried over (a process makes its own)."""
        return (_attach, (self.name, self.engine.timeout))

    def __repr__(self) -> str:
        return (f"<shmbuf.EpisodeBuffer {self.name!r} {len(self)}/{self.capacity} rows, "
                f"{self.num_episodes} episodes, fields={list(self.fields)}>")


def _attach(name: str, timeout: float) -> EpisodeBuffer:
    return EpisodeBuffer.attach(name, timeout=timeout)
