"""d3rlpy's dump format (HDF5, version 2.1; needs h5py): complete episodes written and
read back, as :meth:`shmbuf.compat.d3rlpy.ReplayBuffer.dump` and ``load`` use it."""

from __future__ import annotations

from typing import Any, BinaryIO, Sequence

VERSION = "2.1"  # d3rlpy's dump format


def dump_episodes(episodes: Sequence[Any], f: BinaryIO) -> None:
    import h5py

    with h5py.File(f, "w") as h5:
        keys = ["observations", "actions", "rewards", "terminated"]
        h5.create_dataset("columns", data=keys)
        h5.create_dataset("num_episodes", data=len(episodes))
        for i, ep in enumerate(episodes):
            for key in keys:
                value = getattr(ep, key)
                if isinstance(value, (list, tuple)):
                    for j, part in enumerate(value):
                        h5.create_dataset(f"{key}_{i}_{j}", data=part)
                else:
                    h5.create_dataset(f"{key}_{i}", data=value)
        h5.create_dataset("version", data=VERSION)
        h5.flush()


def dump(episodes: Sequence[Any], f: BinaryIO) -> None:
    """d3rlpy's ``d3rlpy.dataset.dump``: write ``episodes`` (ours, d3rlpy's, or any with
    d3rlpy's fields) to ``f`` in its HDF5 layout."""
    dump_episodes(episodes, f)


def load(episode_cls: type, f: BinaryIO) -> list[Any]:
    """d3rlpy's ``d3rlpy.dataset.load``: the episodes of a dump file, each made by
    ``episode_cls.deserialize``."""
    return load_episodes(f, episode_cls)


def load_episodes(f: BinaryIO, episode_cls: type) -> list[Any]:
    import h5py

    out = []
    with h5py.File(f, "r") as h5:
        version = h5["version"][()]
        version = version.decode() if isinstance(version, bytes) else str(version)
        if version == "2.0":
            raise ValueError("version=2.0 has been obsolete.")
        keys = [k.decode() if isinstance(k, bytes) else str(k) for k in h5["columns"][()]]
        for i in range(int(h5["num_episodes"][()])):
            data = {}
            for key in keys:
                if f"{key}_{i}" in h5:
                    data[key] = h5[f"{key}_{i}"][()]
                else:
                    j, parts = 0, []
                    while f"{key}_{i}_{j}" in h5:
                        parts.append(h5[f"{key}_{i}_{j}"][()])
                        j += 1
                    data[key] = parts
            out.append(episode_cls.deserialize(data))
    return out
