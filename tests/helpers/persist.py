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

__all__ = ['save_and_hang']
