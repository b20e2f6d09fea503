"""Drop-in APIs of the reference replay buffers, backed by shmbuf's shared memory.

One module per library, each thin: it maps the library's calls onto
:class:`shmbuf.Buffer` / :class:`shmbuf.EpisodeBuffer` and keeps the library's names,
signatures, defaults, return types and exceptions; every facade object lives in a
named segment, can be attached from another process (``<Class>.attach(name)``) and
pickles as its name. Each module says at its top which upstream version it behaves as;
the migration pages of the docs (docs/migrate/) list what still differs, and why.

* :mod:`shmbuf.compat.imitation`: ``Buffer``, ``ReplayBuffer``, ``Transitions``
* :mod:`shmbuf.compat.fishyrl`: ``Buffer``, ``SequentialBuffer``, ``IndependentVectorizedBuffer``,
  ``convert_samples_to_tensors``
* :mod:`shmbuf.compat.velora`: ``ReplayBuffer``, ``BatchExperience`` (needs torch)
* :mod:`shmbuf.compat.garage`: ``PathBuffer``, ``HERReplayBuffer``, ``ReplayBuffer``
* :mod:`shmbuf.compat.d3rlpy`: ``ReplayBuffer``, ``FIFOBuffer``, ``InfiniteBuffer``, the
  transition pickers and trajectory slicers, ``Episode``, ``Signature``, ``ActionSpace``,
  ``EpisodeGenerator``, ``MixedReplayBuffer``, ``dump``, ``load`` (d3rlpy's own types where
  it is installed)

``shmbuf.compat.sb3`` and ``shmbuf.compat.torchrl`` subclass their library's classes, so they
import it: without it, their import raises a ``ModuleNotFoundError`` that names the extra
to install (``pip install 'shmbuf[sb3]'``, ``'shmbuf[torchrl]'``). ``import shmbuf`` never
imports them.
"""

from __future__ import annotations

import importlib


def require(facade: str, extra: str, modules: tuple[str, ...]) -> None:
    """Import ``modules`` (the library of the facade ``facade``, in the optional
    dependencies ``extra`` of shmbuf), or raise a ``ModuleNotFoundError`` that says which
    module is missing and which extra installs them.

    Examples:
        >>> require("shmbuf.compat.example", "example", ("json",))
        >>> require("shmbuf.compat.example", "example", ("json", "no_such_module_here"))
        Traceback (most recent call last):
        ...
        ModuleNotFoundError: shmbuf.compat.example needs json and no_such_module_here, which shmbuf's extra 'example' installs: pip install 'shmbuf[example]' (No module named 'no_such_module_here')
    """
    for module in modules:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            raise ModuleNotFoundError(
                f"{facade} needs {', '.join(modules[:-1])} and {modules[-1]}, which shmbuf's extra {extra!r} installs: "
                f"pip install 'shmbuf[{extra}]' ({exc})", name=exc.name) from exc
