"""Samplers: the part of a handle that decides which rows a sample holds.

A handle has one sampler, chosen once when it opens from the segment's metadata
(:func:`choose`), so a sample calls the sampler it has and branches on nothing. A queue
gets :class:`~shmbuf.queue.consumed.Consumed`, a buffer created with ``priority=``
:class:`~shmbuf.priority.prioritized.Prioritized`, one created with
``max_times_sampled=`` :class:`~shmbuf.limited.sampler.Limited`, any other the sampler named at its
creation (``Buffer.create(..., sampler=NAME)``): the class ``SAMPLER`` of the module
``shmbuf.samplers.NAME`` (``uniform``, the default, or ``newest``). A new selector is one
such module, and its test.

Every sampler has the same interface:

* ``sample(n, out, timeout, beta)``: a batch of ``n`` drawn through the one read path
  (:func:`shmbuf.core.read.read`, with a :class:`shmbuf.core.read.Sampler` of its own
  that draws candidates and gathers them with the checked gather);
* ``update(index, priorities, timeout)``: set priorities (samplers that have them);
* ``state()`` / ``restore(rng)``: what it keeps between calls beyond the segment (its
  generator's state), for ``state_dict``.

Examples:
    >>> import numpy as np, shmbuf
    >>> buf = shmbuf.Buffer.create({"x": ((), "int64")}, 8, sampler="newest")
    >>> buf.extend({"x": np.arange(5)})
    >>> type(buf.sampler).__name__, buf.sample(3)["x"].tolist()
    ('Newest', [4, 3, 2])
    >>> buf.close()
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any, Mapping

DEFAULT = "uniform"


def names() -> list[str]:
    """The names ``Buffer.create(sampler=...)`` takes: this folder's selectors (the
    modules with a ``SAMPLER``; the samplers that other arguments choose live in their
    capability's folder)."""
    return sorted(m.name for m in pkgutil.iter_modules(__path__)
                  if hasattr(importlib.import_module(f"{__name__}.{m.name}"), "SAMPLER"))


def check(name: Any) -> str:
    """``name`` if it names a sampler, else the ``ValueError`` that lists them."""
    if not isinstance(name, str) or name not in names():
        raise ValueError(f"sampler must be one of {names()}, got {name!r}")
    return name


def choose(meta: Mapping[str, Any]) -> type:
    """The sampler class of a handle on a segment with metadata ``meta``: a queue's, a
    prioritized buffer's and a ``max_times_sampled=`` buffer's (whose segment names its
    sampler ``"limited"``) from their capability's folder, any other from this one."""
    if meta.get("queue") is not None:
        module = "shmbuf.queue.consumed"
    elif meta.get("priority") is not None:
        module = "shmbuf.priority.prioritized"
    elif meta.get("sampler") == "limited":
        module = "shmbuf.limited.sampler"
    else:
        module = f"{__name__}.{meta.get('sampler', DEFAULT)}"
    return importlib.import_module(module).SAMPLER
