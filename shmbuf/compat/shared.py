"""What every facade does with its shared memory: a name, close, unlink, ``with``, and
pickling as its name (unpickling attaches)."""

from __future__ import annotations

import os
import secrets
from typing import Any, Callable, Mapping, Optional

import numpy as np

from shmbuf.buffer.handle import Buffer


class Shared:
    """Mixin for a facade whose ``_shm()`` returns its :class:`shmbuf.Buffer` handle and
    whose class has ``attach(name)``."""

    def _shm(self) -> Any:
        return self._core  # type: ignore[attr-defined]

    @property
    def core(self) -> Any:
        """The :class:`shmbuf.Buffer` that holds this facade's rows (its ``stats()``,
        ``parts``, ``save``...; None for a facade whose first add makes it, before that)."""
        return self._shm()

    @property
    def name(self) -> str:
        """The segment's name: ``attach(name)`` from any process."""
        return self._shm().name

    def close(self) -> None:
        """Detach (the creating process also removes the buffer, unless ``persist``)."""
        self._shm().close()

    def unlink(self) -> None:
        """Remove the name now, from any process."""
        self._shm().unlink()

    def _or_remove(self, fill: Callable[[], Any]) -> Any:
        """``fill()`` this new buffer and return it; if that raises, remove the buffer first."""
        try:
            fill()
        except BaseException:
            self.unlink()
            self.close()
            raise
        return self

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (type(self).attach, (self.name,))  # type: ignore[attr-defined]


class Lazy(Shared):
    """A facade whose segment its first add makes (fishyrl and garage infer the schema
    from it): ``_core`` is None before, ``_end()`` ends it (the seeds' ``reset`` /
    ``clear``). ``_lanes`` lanes of ``_capacity`` rows; ``_meta()`` what the segment
    records besides its kind, for ``attach``.

    Pickled before its first add, a facade fixes its name (a new one, if none was
    given) and pickles as its configuration: the copy (another process) and the
    original then share the segment that whichever adds first makes; each finds it
    when it looks (``_core``)."""

    KIND = ""
    _live: Optional[Buffer] = None
    _capacity: int
    _lanes = 1
    _name: Optional[str] = None
    _persist = False
    _seed: Any = None
    _joins = False  # pickled before its first add: the segment may be made by a copy

    @property
    def _core(self) -> Optional[Buffer]:
        if self._live is None and self._joins:
            try:  # (a copy of this facade, in another process, may have made it)
                self._live = self._handle(self._name, self._seed)  # type: ignore[arg-type]
            except FileNotFoundError:
                pass
        return self._live

    @_core.setter
    def _core(self, handle: Optional[Buffer]) -> None:
        self._live = handle

    @classmethod
    def _handle(cls, name: str, seed: Any = None) -> Buffer:
        handle = Buffer.attach(name, seed=seed)
        kind = handle.engine.layout.meta.get("kind")
        if kind != cls.KIND:
            handle.close()
            raise ValueError(f"buffer {name!r} is not a {cls.KIND} (it holds {kind!r})")
        return handle

    def _meta(self) -> dict[str, Any]:
        return {}

    def _create(self, fields: Mapping[str, Any]) -> Buffer:
        try:
            self._core = Buffer.create(fields, self._capacity * self._lanes, lanes=self._lanes, seed=self._seed,
                                       name=self._name, persist=self._persist,
                                       _library={"kind": self.KIND, **self._meta()})
        except FileExistsError:
            if not self._joins or self._core is None:
                raise
        return self._core  # type: ignore[return-value]

    def _restore(self, inner: Optional[Mapping[str, Any]]) -> None:
        """A new segment holding ``inner`` (a core state_dict), or none."""
        self._end()
        if inner is not None:
            self._create({k: (tuple(s), np.dtype(d)) for k, (s, d) in inner["fields"].items()}).load_state_dict(inner)

    @property
    def name(self) -> Optional[str]:
        """The segment's name (None until the first add, unless pickled before it)."""
        if self._core is None:
            return self._name if self._joins else None
        return self._core.name

    def _end(self) -> None:
        """Forget every key and row: the segment ends (the RNG goes on), and with it what
        pickling before the first add shared."""
        if self._core is not None:
            self._core.unlink()
            self._core.close()
            self._core = None
        self._joins = False

    def close(self) -> None:
        """Detach (the creating process also removes the buffer, unless ``persist``)."""
        if self._core is not None:
            self._core.close()

    def unlink(self) -> None:
        """Remove the name now, from any process (if the first add made it)."""
        if self._core is not None:
            self._core.unlink()

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        if self._core is not None:
            return (type(self).attach, (self.name,))  # type: ignore[attr-defined]
        if self._name is None:
            self._name = f"{os.getpid()}-{secrets.token_hex(4)}"
        self._joins = True
        state = {k: v for k, v in self.__dict__.items() if k != "_live"}
        return (_unpickle_lazy, (type(self), state))


def _unpickle_lazy(cls: type, state: dict[str, Any]) -> Any:
    """A facade pickled before its first add: its configuration, its segment not made yet."""
    self = cls.__new__(cls)
    self.__dict__.update(state)
    return self
