"""Episodes to and from HDF5, in the flat layout of d3rlpy and D4RL datasets.

h5py is optional (``pip install h5py``) and imported when these functions run. The
file holds every complete episode, steps concatenated in episode order::

    observations       (N, *obs)   the observation field (several: a group of them,
    next_observations  (N, *obs)   one dataset each); next_observations[i] is the
                                   observation after step i (the real final one at an
                                   episode's end)
    actions            (N, *act)   the ``action`` field (``action=`` names another)
    rewards            (N,)        the reward field
    terminals          (N,)        float32 1.0 at the last step of an episode that terminated
    timeouts           (N,)        float32 1.0 at the last step of one that was truncated
    episode_ends       (E,)        int64: one past each episode's last step
    fields/<name>      (N, ...)    any other field
    attrs              format "shmbuf-episodes", version 1, the field names used

d3rlpy reads it with ``MDPDataset(f["observations"][:], f["actions"][:],
f["rewards"][:], f["terminals"][:], timeouts=f["timeouts"][:])``; D4RL tools with the same
keys.

A batch (``sample``'s or ``take``'s, ragged fields included) goes to a file of its own
with :func:`export_batch`: one dataset a fixed field, two a ragged field (``<name>``:
its values end to end, ``<name>.offsets``: int64, row ``i`` is
``values[offsets[i]:offsets[i + 1]]``; see :func:`shmbuf.ragged.batches.as_arrays`);
:func:`import_batch` reads it back. (An episode buffer has no ragged fields.)
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

from shmbuf.ragged.batches import as_arrays, from_arrays
from shmbuf.ragged.jagged import Jagged

if TYPE_CHECKING:
    from shmbuf.episodes import EpisodeBuffer

FORMAT, VERSION = "shmbuf-episodes", 1
BATCH_FORMAT = "shmbuf-batch"


def _h5py() -> Any:
    try:
        import h5py
    except ImportError:
        raise ImportError("HDF5 export and import need h5py: pip install h5py") from None
    return h5py


def _keys(ebuf: "EpisodeBuffer", action: str) -> dict[str, str]:
    """Field name -> dataset name (observations: one, or a group of several)."""
    obs = ebuf.observations
    keys = {o: "observations" if len(obs) == 1 else f"observations/{o}" for o in obs}
    keys.update({"next_" + o: "next_" + k for o, k in keys.items()})
    if action in ebuf.user_fields:
        keys[action] = "actions"
    if ebuf.reward is not None:
        keys[ebuf.reward] = "rewards"
    for name in ebuf.user_fields:
        keys.setdefault(name, f"fields/{name}")
    return keys


def export_episodes(ebuf: "EpisodeBuffer", path: str | os.PathLike, *, action: str = "action",
                    compression: str | None = None) -> int:
    """Write every complete episode of ``ebuf`` (writers may keep writing) to a new HDF5
    file at ``path``; returns how many. ``compression``: an h5py filter (``"gzip"``).

    Examples:
        >>> import tempfile, os, numpy as np, shmbuf
        >>> buf = shmbuf.EpisodeBuffer.create({"obs": ((2,), "float32"), "action": ((), "int64"),
        ...                                    "reward": ((), "float32")}, 32)
        >>> buf.add_episode({"obs": np.zeros((3, 2)), "action": [0, 1, 0], "reward": [1, 1, 1],
        ...                  "next_obs": [1, 1]})
        >>> tmp = tempfile.TemporaryDirectory(); f = os.path.join(tmp.name, "episodes.h5")
        >>> export_episodes(buf, f)
        1
        >>> import h5py; h5py.File(f)["terminals"][:].tolist()
        [0.0, 0.0, 1.0]
        >>> buf.close(); tmp.cleanup()
    """
    h5py = _h5py()
    episodes = list(ebuf.episodes())
    keys = _keys(ebuf, action)
    lengths = [len(e["terminated"]) for e in episodes]
    # the file is made first, readable by its owner alone (0600, like the segment) and
    # never over an existing file; h5py then writes into it
    os.close(os.open(os.fspath(path), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
    try:
        _write(h5py, path, ebuf, episodes, keys, lengths, action, compression)
    except BaseException:
        os.unlink(os.fspath(path))
        raise
    return len(episodes)


def _write(h5py: Any, path: Any, ebuf: "EpisodeBuffer", episodes: list, keys: dict, lengths: list,
           action: str, compression: Any) -> None:
    with h5py.File(os.fspath(path), "w") as f:
        f.attrs.update({"format": FORMAT, "version": VERSION, "observations": list(ebuf.observations),
                        "action": action if action in ebuf.user_fields else "", "reward": ebuf.reward or ""})
        for name, key in keys.items():
            shape, dtype = ebuf.core.fields[name[5:] if name.startswith("next_") else name]
            data = np.concatenate([e[name] for e in episodes]) if episodes else np.empty((0,) + shape, dtype)
            f.create_dataset(key, data=data, compression=compression)
        for flag, key in (("terminated", "terminals"), ("truncated", "timeouts")):
            marks = [np.zeros(n, np.float32) for n in lengths]
            for m, e in zip(marks, episodes):
                m[-1] = float(e[flag][-1])
            f.create_dataset(key, data=np.concatenate(marks) if marks else np.zeros(0, np.float32))
        f.create_dataset("episode_ends", data=np.cumsum(lengths, dtype=np.int64))


def import_episodes(ebuf: "EpisodeBuffer", path: str | os.PathLike, *, action: str = "action") -> int:
    """Add the episodes of an HDF5 file written by :func:`export_episodes` (or any file
    with its datasets) to ``ebuf``, whose fields must match; returns how many. Without
    ``episode_ends``, episodes end where ``terminals`` or ``timeouts`` is set."""
    h5py = _h5py()
    keys = _keys(ebuf, action)
    with h5py.File(os.fspath(path), "r") as f:
        missing = [k for k in keys.values() if k not in f]
        if missing:
            raise ValueError(f"{os.fspath(path)!r} lacks the datasets {missing} that the buffer's fields "
                             f"need ({list(keys)})")
        term = np.asarray(f["terminals"][:]) if "terminals" in f else None
        if "episode_ends" in f:
            ends = np.asarray(f["episode_ends"][:], np.int64)
        else:
            done = (term if term is not None else 0) + (np.asarray(f["timeouts"][:]) if "timeouts" in f else 0)
            ends = np.flatnonzero(np.asarray(done) > 0) + 1
        data = {name: f[key] for name, key in keys.items()}
        starts = np.concatenate([[0], ends[:-1]])
        for a, b in zip(starts.tolist(), ends.tolist()):
            episode = {name: d[a:b] for name, d in data.items() if not name.startswith("next_")}
            for o in ebuf.observations:
                episode["next_" + o] = data["next_" + o][b - 1]
            ebuf.add_episode(episode, terminated=bool(term is not None and term[b - 1] > 0))
    return len(ends)


def export_batch(batch: Mapping[str, Any], path: str | os.PathLike, *, compression: str | None = None) -> None:
    """Write a batch (fixed fields as arrays of ``n`` rows, ragged fields as
    :class:`~shmbuf.ragged.jagged.Jagged`) to a new HDF5 file at ``path`` (0600; never
    over an existing file): a dataset per fixed field, ``<name>`` and ``<name>.offsets``
    per ragged field (see the module). ``compression``: an h5py filter (``"gzip"``).

    Examples:
        >>> import tempfile, os, numpy as np
        >>> from shmbuf import Jagged
        >>> tmp = tempfile.TemporaryDirectory(); f = os.path.join(tmp.name, "batch.h5")
        >>> export_batch({"tokens": Jagged.from_rows([[5, 6, 7], [8]]), "reward": np.ones(2)}, f)
        >>> import h5py; h5py.File(f)["tokens.offsets"][:].tolist()
        [0, 3, 4]
        >>> import_batch(f)["tokens"][0].tolist()
        [5, 6, 7]
        >>> tmp.cleanup()
    """
    h5py = _h5py()
    arrays = as_arrays(batch)
    from_arrays(arrays)  # (checked before the file is made: names, offsets, row counts)
    os.close(os.open(os.fspath(path), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
    try:
        with h5py.File(os.fspath(path), "w") as f:
            f.attrs.update({"format": BATCH_FORMAT, "version": VERSION, "fields": list(batch),
                            "ragged": [k for k, v in batch.items() if isinstance(v, Jagged)]})
            for key, a in arrays.items():
                f.create_dataset(key, data=a, compression=compression)
    except BaseException:
        os.unlink(os.fspath(path))
        raise


def import_batch(path: str | os.PathLike) -> dict[str, Any]:
    """The batch an HDF5 file of :func:`export_batch` holds (or any file of datasets named
    so), read into memory: ragged fields as :class:`~shmbuf.ragged.jagged.Jagged`
    (checked: ``ValueError`` for offsets that are not int64, decrease or pass the values'
    end, fields of different row counts)."""
    h5py = _h5py()
    with h5py.File(os.fspath(path), "r") as f:
        order = [str(k) for k in f.attrs.get("fields", [])] or list(f.keys())
        arrays = {}
        for k in order + [k for k in f.keys() if k not in order]:
            if not isinstance(f[k], h5py.Dataset):
                raise ValueError(f"{os.fspath(path)!r}: {k!r} is a group, not a batch's dataset")
            arrays[k] = np.asarray(f[k][()])
    return from_arrays(arrays)
