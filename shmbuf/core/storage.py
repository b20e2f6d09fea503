"""A buffer's storage, chosen once from its name: the one place that looks at a name to
tell where a buffer lives.

* a segment in ``/dev/shm`` (:class:`~shmbuf.core.segment.Segment`, ``kind`` ``"shm"``);
* a buffer file, for a name with a ``/`` or one given as ``path=``
  (:class:`~shmbuf.core.files.FileSegment`, ``kind`` ``"file"``): it may be larger than
  memory, it outlives every process, and a restart of the machine rolls it back to its
  last flush (``durable``: see :mod:`shmbuf.core.durable`).

Everything else asks the storage class it got: ``check_name``, ``check_space``,
``create``, ``attach``, ``durable``, ``kind``.

Examples:
    >>> of("replay").kind, of("./replay.shmbuf").kind, of("replay.shmbuf", path=True).kind
    ('shm', 'file', 'file')
"""

from __future__ import annotations

from shmbuf.core.files import FileSegment, is_path
from shmbuf.core.segment import Segment


def of(name: object, path: bool = False) -> type[Segment]:
    """The storage of the buffer ``name`` (``path``: a file, whatever the name)."""
    return FileSegment if path or is_path(name) else Segment


def check(name: object, path: bool = False) -> str:
    """``name`` checked by its storage (a file's path made absolute)."""
    return of(name, path).check_name(name)
