"""Saves stopped halfway.

Code that runs in child processes lives here, importable by name (spawn, forkserver
and Ray workers import it).
"""

from __future__ import annotations

import time

import shmbuf

def save_and_hang(name: str, path: str, flag: str) -> None:
    """Save buffer ``name`` to ``path``, stopping for good after the first chunk of rows
    went to disk (``flag`` then exists): a save killed in the middle."""
    from shmbuf.persist import save as persist

    def stop(self, nbytes):
        open(flag, "w").close()
        time.sleep(600)
    persist.Progress.__call__ = stop
    with shmbuf.Buffer.attach(name) as buf:
        buf.save(path)



def power_cut_images(flushed: bytes, memory: bytes, boot_offset: int, boot: int, limit: int | None = None,
                     seed: int = 0):
    """Every file a power loss can leave between two durability points: the file as the
    last one left it on the disk (``flushed``), with any combination of the pages that
    changed since (in ``memory``) on the disk instead (the kernel writes pages back in no
    order), and the header's boot id another boot's (``boot``, at ``boot_offset``).
    Yields ``(pages on the disk, image)``. ``limit``: if there are more combinations,
    ``limit`` of them: none of the pages, all of them, and random ones (``seed``)."""
    import itertools

    import numpy as np

    page = 4096
    dirty = [i for i in range(-(-len(flushed) // page))
             if flushed[i * page:(i + 1) * page] != memory[i * page:(i + 1) * page]]
    combos = itertools.product((False, True), repeat=len(dirty))
    if limit is not None and 2 ** len(dirty) > limit:
        rng = np.random.default_rng(seed)
        combos = [(False,) * len(dirty), (True,) * len(dirty)]
        combos += [tuple(rng.random(len(dirty)) < 0.5) for _ in range(max(0, limit - 2))]
    for chosen in combos:
        out = bytearray(flushed)
        for i, on in zip(dirty, chosen):
            if on:
                out[i * page:(i + 1) * page] = memory[i * page:(i + 1) * page]
        out[boot_offset:boot_offset + 8] = boot.to_bytes(8, "little", signed=True)
        yield [i for i, on in zip(dirty, chosen) if on], bytes(out)

__all__ = ['power_cut_images', 'save_and_hang']
