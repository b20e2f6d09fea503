"""What a Buffer holds, as a whole: clear it, count it, copy it out and back
(``state_dict``), save it to a directory and load it back. A part of
:class:`shmbuf.Buffer` (it uses the handle's engine only)."""

from __future__ import annotations

import os
from typing import Any, Mapping

from shmbuf.core import contents, report
from shmbuf.core import validate
from shmbuf.core.deadline import Deadline
from shmbuf.core.engine import DEFAULT_TIMEOUT, Engine



class Snapshots:
    """``Buffer``'s whole-buffer operations (see :class:`shmbuf.Buffer`)."""

    engine: Engine
    sampler: Any  # the handle's sampler (shmbuf.samplers)
    _versions: Any  # the handle's versions part (shmbuf.versions.bound)

    def clear(self, *, timeout: float | None = None) -> None:
        """Forget every row (all lanes). Safe while writers run: their rows in flight
        land after the clear and count as new.

        Examples:
            >>> import numpy as np, shmbuf
            >>> buf = shmbuf.Buffer.from_data({"x": np.arange(3)}); buf.clear(); len(buf)
            0
            >>> import numpy as np, shmbuf
            >>> buf.close()
        """
        e = self.engine
        e.writes.clear(e.seconds(timeout))

    def flush(self, *, timeout: float | None = None) -> None:
        """A durability point of a buffer in a file: every row published before the call
        is on the disk when it returns, and a restart of the machine (a power loss, a
        crash, a reboot) rolls the buffer back to the last flush, never further. It
        writes the pages changed since the last flush (``msync`` + ``fsync``); it costs
        what the disk takes to write them. Writers and samplers go on meanwhile. For a
        buffer in ``/dev/shm`` (gone at a restart anyway) it does nothing. ``timeout``
        bounds its two waits for the header lock, one deadline for both; the disk
        write itself is not interrupted.

        Examples:
            >>> import numpy as np, shmbuf, tempfile, os
            >>> tmp = tempfile.TemporaryDirectory(); path = os.path.join(tmp.name, "doc.shmbuf")
            >>> buf = shmbuf.Buffer.create({"x": ((), "int64")}, 8, path=path)
            >>> buf.extend({"x": np.arange(3)}); buf.flush()
            >>> buf.close(); len(shmbuf.Buffer.attach(path))
            3
            >>> shmbuf.Buffer.attach(path).unlink(); tmp.cleanup()
        """
        self.engine.flush(timeout)

    def stats(self) -> dict[str, Any]:
        """Counters of the buffer, kept by every handle of every process in the segment
        (no lock on the hot path; see :mod:`shmbuf.core.report`): rows held and inserted,
        batches and rows sampled, torn-read retries, lock acquisitions and seconds
        waited for the lock, write calls; per process (pid, alive, its counts) and per
        lane (rows, last writer's pid, whether it is alive, time of the last write,
        claimer; in a buffer created with ``versions=True``, the newest row's
        ``newest_version``, and ``sampled_staleness``: see
        :meth:`~shmbuf.versions.bound.Versions.describe`; with ragged fields, each lane's
        ``arena_bytes``, ``arena_held``, the bytes its rows' values take, and
        ``arena_reserved``, ever). ``shmbuf stat NAME`` prints the same from a shell.

        Examples:
            >>> import numpy as np, shmbuf
            >>> buf = shmbuf.Buffer.from_data({"x": np.arange(4)})
            >>> _ = buf.sample(3); s = buf.stats()
            >>> s["rows_inserted"], s["batches_sampled"], s["rows_sampled"]
            (4, 1, 3)
            >>> import numpy as np, shmbuf
            >>> buf.close()
        """
        e = self.engine
        out = {**report.read(e), **e.writes.stats()}
        self._versions.describe(e, out)
        e.records.describe(out)
        return out

    def state_dict(self, *, timeout: float | None = None) -> dict[str, Any]:
        """A copy of the contents, positions and this handle's RNG state.

        Safe while other processes write and sample: rows being written or overwritten
        during the copy are left out (see :mod:`shmbuf.core.contents`).
        :meth:`load_state_dict` on a buffer with the same fields, capacity and lanes
        restores it; the following samples are then identical.

        Examples:
            >>> import numpy as np, shmbuf
            >>> a = shmbuf.Buffer.from_data({"x": np.arange(5)}, seed=1)
            >>> b = shmbuf.Buffer.create(a.fields, 5)
            >>> b.load_state_dict(a.state_dict())
            >>> a.sample(3)["x"].tolist() == b.sample(3)["x"].tolist()
            True
            >>> import numpy as np, shmbuf
            >>> a.close(); b.close()
        """
        e = self.engine
        return e.records.snapshot(contents.snapshot(e.ring, e.layout.stored(), self.sampler.state()["rng"],
                                                    e.seconds(timeout), e.writes))  # (its waits: one deadline)

    def load_state_dict(self, state: Mapping[str, Any], *, timeout: float | None = None) -> None:
        """Restore :meth:`state_dict` output; a bad state raises and changes nothing.

        Samplers in other processes may run meanwhile (they never mix old and restored
        rows). Writers wait for the restore, up to their timeout: it holds the header
        lock, after letting the writes in flight finish. Rows get new sequence numbers
        (``total_added`` grows); ``len()``, the rows and the samples are as saved.
        ``timeout`` bounds the call's waits (for the lock, the writes in flight, and the
        steps after the copy), one deadline for all; the copy itself, and a buffer
        file's writes to the disk, are not interrupted.
        """
        e = self.engine
        checked = e.records.check_state(state, contents.check(state, e.layout, e.layout.stored(), e.writes))
        deadline = Deadline(e.seconds(timeout))
        contents.restore(e.ring, checked, deadline.left(), seg=e.seg)
        e.writes.reset(deadline.left())  # (a queue: every row restored is one not yet taken)
        self.sampler.restore(checked["rng"])

    def save(self, path: str | os.PathLike, *, overwrite: bool = False,
             progress: bool | None = None, timeout: float | None = None) -> dict[str, Any]:
        """Save the buffer into the directory ``path`` while others keep writing and
        sampling (writers wait at most for one header read). No pickle: JSON metadata
        and one ``.npy`` file an array (format in :mod:`shmbuf.persist.save`).

        The save holds the rows published when it started that were not overwritten
        during it, each whole; rows in flight are left out (counted in the summary it
        returns). It is written to a temporary directory renamed into place at the end,
        so an interrupted save never leaves a directory that loads. ``overwrite=True``
        replaces an earlier save. ``progress``: a progress bar on stderr (default: on
        a terminal). ``timeout`` bounds its waits (the priorities', a queue's takes in
        flight, the header lock's), one deadline for all; the copy and the writes to
        the disk are not interrupted.

        Examples:
            >>> import numpy as np, shmbuf
            >>> import tempfile, os
            >>> tmp = tempfile.TemporaryDirectory(); d = os.path.join(tmp.name, "replay")
            >>> buf = shmbuf.Buffer.from_data({"x": np.arange(5)}, seed=0)
            >>> buf.save(d)["rows"]
            5
            >>> import numpy as np, shmbuf
            >>> copy = shmbuf.Buffer.load(d, name=f"{buf.name}-copy")
            >>> copy.sample(3)["x"].shape
            (3,)
            >>> import numpy as np, shmbuf
            >>> buf.close(); copy.close(); tmp.cleanup()
        """
        from shmbuf.persist import save as persist

        return persist.save(self.engine, path, overwrite=validate.flag(overwrite, "overwrite"),
                            progress=progress, timeout=self.engine.seconds(timeout))

    @classmethod
    def load(cls, path: str | os.PathLike, *, name: str | None = None, persist: bool = False,
             restore_rng: bool = False, seed: Any = None, timeout: float = DEFAULT_TIMEOUT,
             progress: bool | None = None) -> Any:
        """Create a buffer in shared memory from a :meth:`save` directory: the same
        schema, capacity, lanes, rows in the same slots and order, episodes, priorities
        and rate-limit counters; ``name`` defaults to the saved buffer's name.
        ``restore_rng=True`` gives the handle the saving handle's RNG state (then it
        samples what the saved handle would have); else ``seed`` seeds it.

        Everything is checked before anything is created: a missing, truncated or
        edited file, another format version or a schema that does not match raise
        ``ValueError`` (``FileNotFoundError`` for no directory) and leave nothing in
        ``/dev/shm``; a taken name raises ``FileExistsError`` and leaves that buffer
        alone. An episode buffer's save loads here as its core Buffer; use
        :meth:`shmbuf.EpisodeBuffer.load` to get an EpisodeBuffer. ``timeout`` (also the
        new handle's default) bounds the waits for its header lock, before and after the
        rows are copied in, one deadline for all from the call's start (each wait gets at
        least ``LOCK_FLOOR``); reading the files and the copy are not interrupted.
        """
        from shmbuf.persist import save as _persist

        return _persist.load(cls, path, name=name, persist=validate.flag(persist, "persist"),
                             restore_rng=validate.flag(restore_rng, "restore_rng"), seed=seed,
                             timeout=validate.timeout(timeout), progress=progress)
