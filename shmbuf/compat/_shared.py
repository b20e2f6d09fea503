"""What every facade does with its shared memory: a name, close, unlink, ``with``, and
pickling as its name (unpickling attaches)."""

from __future__ import annotations

from typing import Any, Callable


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
