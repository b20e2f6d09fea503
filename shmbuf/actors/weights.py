"""Versioned policy weights in shared memory: a learner publishes, actors read the latest.

Async actors need the learner's newest weights as much as the learner needs their data.
:class:`Weights` keeps a dict of arrays (a torch ``state_dict`` works as it is) in one
named segment, **twice**::

    header (4 kB)   magic, schema size, current copy (0 or 1), per copy: version, seq
                    then the schema: JSON [{name, dtype, shape}] in publish order
    copy 0, copy 1  every array, each 64-byte aligned

**Publish** (one publisher at a time: the segment's ``flock``, which the kernel releases
if the publisher dies) writes the copy that is *not* current: its seq goes odd, the
arrays are copied, its version is set, its seq goes even, then it becomes current.
**Read** (no lock) takes the current copy, notes its seq, copies the arrays and checks the
seq again: a reader never returns a mix of two versions, and a learner killed while
publishing only ever leaves the copy nobody reads half-written, so no reader waits on
a dead learner. Checking for a new version reads one integer.

A restarted learner calls :meth:`Weights.create` with ``exist_ok=True`` (same schema:
it takes over the segment) or creates a new one of the same name after the old creator
has gone; actors notice a new segment under the name and switch to it by themselves.

Examples:
    >>> import numpy as np
    >>> learner = Weights.create("doc-policy", {"w": np.zeros((2, 2), np.float32), "b": np.zeros(2)})
    >>> learner.publish({"w": np.ones((2, 2)), "b": [1.0, 2.0]})
    1
    >>> actor = Weights.attach("doc-policy")
    >>> version, params = actor.read()
    >>> version, params["b"].tolist(), actor.read(newer_than=version)
    (1, [1.0, 2.0], None)
    >>> actor.close(); learner.close()
"""

from __future__ import annotations

import fcntl
import json
import os
import struct
import time
import weakref
from typing import Any, Mapping

import numpy as np

from shmbuf.core.layout import dtype_from_json, normalize_fields
from shmbuf.core.segment import FormatError, Segment

MAGIC = b"\x93SHMWTS\x01"
HEADER = 4096
ALIGN = 64
_HEAD = struct.Struct("<8sQ")  # magic, schema bytes
W_CURRENT, W_VERSION, W_SEQ = 2, 3, 5  # int64 words: current copy; versions [2]; seqs [2]
_WORDS = 8
_RELINK_CHECK = 1.0  # seconds between a reader's checks that the name still holds its segment


def _as_arrays(state: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """numpy views of a dict of arrays or torch tensors (tensors: detached, on the CPU)."""
    if not isinstance(state, Mapping) or not state:
        raise TypeError(f"weights are a non-empty mapping of name -> array or tensor, got {type(state).__name__}")
    out = {}
    for k, v in state.items():
        if hasattr(v, "detach") and hasattr(v, "cpu"):  # a torch tensor (torch is not imported)
            v = v.detach().cpu()
            try:
                v = v.numpy()
            except TypeError:
                raise TypeError(f"weights[{k!r}]: {v.dtype} has no numpy equivalent; convert it "
                                "(to float32, say) before publishing") from None
        out[k] = np.asarray(v)
    return out


def _offsets(schema: list[tuple[str, tuple[int, ...], np.dtype]]) -> tuple[list[int], int]:
    """Offsets of the arrays inside one copy, and the copy's size."""
    offsets, pos = [], 0
    for _, shape, dtype in schema:
        offsets.append(pos)
        pos += -(-int(np.prod(shape, dtype=np.int64)) * dtype.itemsize // ALIGN) * ALIGN or ALIGN
    return offsets, pos


class Weights:
    """A named, versioned set of arrays for a learner to publish and actors to read."""

    def __init__(self, seg: Segment, schema: list[tuple[str, tuple[int, ...], np.dtype]],
                 owner: bool) -> None:
        self._seg, self._schema = seg, schema
        self.name = seg.name
        self._words = np.ndarray((_WORDS,), np.int64, seg.mmap, 0)
        offsets, self._copy_size = _offsets(schema)
        self._views = [{name: np.ndarray(shape, dtype, seg.mmap, HEADER + c * self._copy_size + off)
                        for (name, shape, dtype), off in zip(schema, offsets)} for c in (0, 1)]
        # publishers flock a descriptor of their own (not one a forked child shares)
        self._lock_fd = os.open(f"/proc/self/fd/{seg.fd}", os.O_RDWR | os.O_CLOEXEC) \
            if os.path.exists(f"/proc/self/fd/{seg.fd}") else os.dup(seg.fd)
        self._linked_at = time.monotonic()
        # closes (and, in the creating process, removes) it when closed, collected or at exit
        self._finalizer = weakref.finalize(self, _finalize, seg, self._lock_fd, os.getpid() if owner else None)

    # -- making and finding ----------------------------------------------------------------

    @classmethod
    def create(cls, name: str, template: Mapping[str, Any], *, exist_ok: bool = False,
               persist: bool = False) -> "Weights":
        """A new weights segment shaped like ``template`` (a dict of arrays or a torch
        ``state_dict``), version 0 (nothing published). ``exist_ok=True``: if ``name``
        already holds weights of the same names, shapes and dtypes, take it over (a
        restarted learner). The creator's :meth:`close` (or exit) removes the name
        unless ``persist=True``."""
        arrays = _as_arrays(template)
        specs = normalize_fields({k: (a.shape, a.dtype) for k, a in arrays.items()})
        schema = [(f.name, f.shape, f.dtype) for f in specs]
        if exist_ok:
            try:
                found = cls.attach(name)
            except FileNotFoundError:
                pass
            else:
                if found.schema != schema:
                    found.close()
                    raise ValueError(f"weights {name!r} exist with another schema: "
                                     f"{found.describe()}; remove them or use another name")
                return found
        doc = json.dumps([{"name": n, "dtype": np.lib.format.dtype_to_descr(d), "shape": list(s)}
                          for n, s, d in schema]).encode()
        if _HEAD.size + 8 * _WORDS + len(doc) > HEADER:
            raise ValueError(f"the names of {len(schema)} arrays take {len(doc)} bytes of schema; at most "
                             f"{HEADER - _HEAD.size - 8 * _WORDS} fit (fewer or shorter names)")
        _, size = _offsets(schema)
        seg = Segment.create(name, HEADER + 2 * size)
        try:
            seg.mmap[_HEAD.size + 8 * _WORDS:_HEAD.size + 8 * _WORDS + len(doc)] = doc
            _HEAD.pack_into(seg.mmap, 0, b"\0" * 8, len(doc))
            seg.mmap[0:8] = MAGIC  # last: a half-made header never validates
            w = cls(seg, schema, owner=not persist)
        except BaseException:
            seg.unlink()
            seg.close()
            raise
        if persist:
            seg.untrack()
        return w

    @classmethod
    def attach(cls, name: str) -> "Weights":
        """Attach to weights by name (any process). Everything read from the segment is
        checked: a segment that is not shmbuf weights raises :class:`~shmbuf.FormatError`."""
        seg = Segment.attach(name)
        try:
            return cls(seg, _read_schema(seg), owner=False)
        except BaseException:
            seg.close()
            raise

    # -- publishing and reading ----------------------------------------------------------

    def publish(self, state: Mapping[str, Any], *, timeout: float = 10.0) -> int:
        """Publish ``state`` (the template's names, shapes; values cast to its dtypes)
        as the next version; returns it. Readers see it whole or not at all."""
        arrays = _as_arrays(state)
        names = [n for n, _, _ in self._schema]
        if sorted(arrays) != sorted(names):
            raise ValueError(f"publish needs exactly the arrays {names}, got {list(arrays)}")
        for n, shape, _ in self._schema:
            if arrays[n].shape != shape:
                raise ValueError(f"weights[{n!r}]: expected shape {shape}, got {arrays[n].shape}")
        self._lock(timeout)
        try:
            w = self._words
            cur = int(w[W_CURRENT]) & 1
            nxt = 1 - cur
            version = int(w[W_VERSION + cur]) + 1
            w[W_SEQ + nxt] = (int(w[W_SEQ + nxt]) | 1) + 2  # odd: being written
            for n, dst in self._views[nxt].items():
                np.copyto(dst, arrays[n], casting="same_kind")
            w[W_VERSION + nxt] = version
            w[W_SEQ + nxt] += 1  # even: complete
            w[W_CURRENT] = nxt  # readers switch to it
            return version
        finally:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def _lock(self, timeout: float) -> None:
        deadline, delay = time.monotonic() + timeout, 1e-4
        while True:
            try:
                fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"weights {self.name!r}: another publisher held the lock for "
                                       f"{timeout:g} s (a stopped process?)") from None
                time.sleep(delay)
                delay = min(2 * delay, 0.01)

    @property
    def schema(self) -> list[tuple[str, tuple[int, ...], np.dtype]]:
        """``[(name, shape, dtype)]`` of the arrays, in order."""
        return list(self._schema)

    @property
    def nbytes(self) -> int:
        """Bytes of shared memory the weights take (both copies and the header)."""
        return self._seg.size

    @property
    def version(self) -> int:
        """The latest published version (0: none yet). One integer read."""
        w = self._words
        return int(w[W_VERSION + (int(w[W_CURRENT]) & 1)])

    def read(self, *, newer_than: int | None = None, timeout: float = 10.0) -> tuple[int, dict[str, np.ndarray]] | None:
        """``(version, {name: array})``: a copy of the latest complete version, or None if
        it is not newer than ``newer_than`` (a cheap check: one integer) or nothing was
        published. At most once a second it also checks that the name still holds these
        weights; if a restarted learner made new ones, it switches to them (and their
        versions count from 1 again: any of them is returned)."""
        now = time.monotonic()
        if now - self._linked_at >= _RELINK_CHECK:  # (a system call: at most once a second)
            self._linked_at = now
            if not self._seg.is_linked() and self._follow():
                newer_than = None  # new weights under the name: any version of them is new here
        if newer_than is not None and self.version <= newer_than:
            return None
        deadline = time.monotonic() + timeout
        w = self._words
        while True:
            cur = int(w[W_CURRENT]) & 1
            seq = int(w[W_SEQ + cur])
            version = int(w[W_VERSION + cur])
            if not seq & 1:
                out = {n: a.copy() for n, a in self._views[cur].items()}
                if int(w[W_SEQ + cur]) == seq:
                    if version == 0 or newer_than is not None and version <= newer_than:
                        return None
                    return version, out
            if time.monotonic() >= deadline:
                raise TimeoutError(f"weights {self.name!r}: publishes kept overtaking the read for {timeout:g} s")
            time.sleep(1e-4)

    def load_into(self, model: Any, *, newer_than: int | None = None, timeout: float = 10.0) -> int | None:
        """Copy the latest version into a torch module (``load_state_dict``) or a dict of
        arrays; returns its version, or None if there is nothing newer than ``newer_than``
        (``timeout``: :meth:`read`'s)."""
        got = self.read(newer_than=newer_than, timeout=timeout)
        if got is None:
            return None
        version, arrays = got
        if hasattr(model, "load_state_dict"):
            import torch

            model.load_state_dict({k: torch.from_numpy(v) for k, v in arrays.items()})
        else:
            for k, v in arrays.items():
                np.copyto(model[k], v)
        return version

    def _follow(self) -> bool:
        """The name was removed or re-created: map what it names now, if it is weights of
        the same schema, and say so (else keep the old segment: its last version stays
        readable)."""
        try:
            seg = Segment.attach(self.name)
        except (FileNotFoundError, OSError, ValueError):
            return False
        try:
            schema = _read_schema(seg)
        except (FormatError, ValueError):
            seg.close()
            return False
        if schema != self._schema:
            seg.close()
            return False
        old = self._finalizer
        self.__init__(seg, schema, owner=False)  # type: ignore[misc]
        old()  # (a reader never owns: the old segment is only closed)
        return True

    def describe(self) -> str:
        return ", ".join(f"{n} {d} {s}" for n, s, d in self._schema)

    # -- lifetime ----------------------------------------------------------------------

    def close(self) -> None:
        """Detach; the creator (unless ``persist=True``) also removes the name. Also done
        when the handle is collected and at exit."""
        self._views = []
        self._finalizer()

    def unlink(self) -> None:
        self._seg.unlink()

    def __enter__(self) -> "Weights":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<shmbuf.Weights {self.name!r} version {self.version}: {self.describe()}>"


def _finalize(seg: Segment, lock_fd: int, owner_pid: int | None) -> None:
    os.close(lock_fd)
    if owner_pid is not None and owner_pid == os.getpid():
        seg.unlink()
    seg.close()


def _read_schema(seg: Segment) -> list[tuple[str, tuple[int, ...], np.dtype]]:
    """The schema of a weights segment, every byte of it checked."""
    mem = seg.mmap
    if seg.size < HEADER or bytes(mem[0:8]) != MAGIC:
        raise FormatError(f"segment {seg.name!r} is not shmbuf weights (a buffer? attach it with "
                          "shmbuf.Buffer.attach)")
    _, n = _HEAD.unpack_from(mem, 0)
    start = _HEAD.size + 8 * _WORDS
    if n > HEADER - start:
        raise FormatError(f"weights {seg.name!r}: schema size {n} is past the header")
    try:
        doc = json.loads(bytes(mem[start:start + n]).decode())
        fields = {d["name"]: (tuple(d["shape"]), dtype_from_json(d["dtype"])) for d in doc}
        if len(fields) != len(doc):
            raise ValueError("repeated names")
        schema = [(f.name, f.shape, f.dtype) for f in normalize_fields(fields)]
    except (ValueError, TypeError, KeyError, UnicodeDecodeError) as exc:
        raise FormatError(f"weights {seg.name!r}: bad schema ({exc})") from None
    _, size = _offsets(schema)
    if seg.size != HEADER + 2 * size:
        raise FormatError(f"weights {seg.name!r}: the segment has {seg.size} bytes, its schema needs {HEADER + 2 * size}")
    return schema


def is_weights(name: str) -> bool:
    """True if ``name`` is a weights segment (for ``shmbuf ls``)."""
    try:
        seg = Segment.attach(name)
    except (OSError, ValueError):
        return False
    try:
        return seg.size >= 8 and bytes(seg.mmap[0:8]) == MAGIC
    finally:
        seg.close()


