"""What every facade does with its shared memory: a name, close, unlink, ``with``, and
pickling as its name (unpickling attaches)."""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional

import numpy as np

from ..buffer import Buffer


class Shared:
    """Mixin for a facade whose ``_shm()`` returns its :class:`shmbuf.Buffer` handle and
    whose class has ``attach(name)``."""

    def _shm(self) -> Any:
        return self._core  # type: ignore[attr-defined]

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
    records besides its kind, for ``attach``."""

    KIND = ""
    _core: Optional[Buffer]
    _capacity: int
    _lanes = 1
    _name: Optional[str] = None
    _persist = False
    _seed: Any = None

    @classmethod
    def _handle(cls, name: str, seed: Any = None) -> Buffer:
        handle = Buffer.attach(name, seed=seed)
        if handle.meta.get("kind") != cls.KIND:
            handle.close()
            raise ValueError(f"buffer {name!r} is not a {cls.KIND} (it holds {handle.meta.get('kind')!r})")
        return handle

    def _meta(self) -> dict[str, Any]:
        return {}

    def _create(self, fields: Mapping[str, Any]) -> Buffer:
        self._core = Buffer.create(fields, self._capacity * self._lanes, lanes=self._lanes, seed=self._seed,
                                   name=self._name, persist=self._persist, meta={"kind": self.KIND, **self._meta()})
        return self._core

    def _restore(self, inner: Optional[Mapping[str, Any]]) -> None:
        """A new segment holding ``inner`` (a core state_dict), or none."""
        self._end()
        if inner is not None:
            self._create({k: (tuple(s), np.dtype(d)) for k, (s, d) in inner["fields"].items()}).load_state_dict(inner)

    @property
    def name(self) -> Optional[str]:
        """The segment's name (None until the first add)."""
        return None if self._core is None else self._core.name

    def _end(self) -> None:
        """Forget every key and row: the segment ends (the RNG goes on)."""
        if self._core is not None:
            self._core.unlink()
            self._core.close()
            self._core = None

    def close(self) -> None:
        """Detach (the creating process also removes the buffer, unless ``persist``)."""
        if self._core is not None:
            self._core.close()

    def unlink(self) -> None:
        """Remove the name now, from any process (if the first add made it)."""
        if self._core is not None:
            self._core.unlink()

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        if self._core is None:
            raise TypeError(f"a {type(self).__name__} has no shared memory before its first add: "
                            "nothing to attach to")
        return (type(self).attach, (self.name,))  # type: ignore[attr-defined]
