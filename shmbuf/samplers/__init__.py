"""Samplers: the part of a handle that decides which rows a sample holds.

A handle has one sampler, opened once from the segment's record of its parts
(:mod:`shmbuf.parts`), so a sample calls the sampler it has and branches on nothing. A
queue's is :class:`~shmbuf.queue.consumed.Consumed`, a prioritized buffer's
:class:`~shmbuf.priority.prioritized.Prioritized`, a ``max_times_sampled=`` buffer's
:class:`~shmbuf.limited.sampler.Limited`; any other buffer's is the one named at its
creation (``Buffer.create(..., sampler=...)``, see :mod:`shmbuf.samplers.part`): the
class ``SAMPLER`` of a module of this folder (:func:`names`), or a class of yours.

**A new sampler is one module and its test.** The module defines ``SAMPLER``, a class
that keeps this contract:

* ``SAMPLER.options(given)`` (a classmethod; leave it out for a sampler without
  options): the create-time options checked, returned JSON-able (they are recorded in
  the segment, and given back to it on every attach); bad ones raise ``ValueError`` or
  ``TypeError`` saying which, what was expected and what was given;
* ``SAMPLER(engine, outputs, **options)``: the handle's
  :class:`~shmbuf.core.engine.Engine` and :class:`~shmbuf.core.batch.Outputs`;
* ``sample(n, out, timeout, beta)``: a batch of ``n``, read through the one read path
  (``engine.read`` with a :class:`shmbuf.core.read.Sampler` of its own that *draws*
  candidates from ``engine.window()`` and *gathers* them with ``engine.gather``, the
  checked gather): never copy rows any other way, and the read path guarantees what
  every sampler guarantees (no torn, unpublished or overwritten row; one deadline);
* ``update(index, priorities, timeout)``: set priorities (or raise the ``ValueError``
  of a buffer without them, as :class:`~shmbuf.samplers.uniform.Uniform` does);
* ``state()`` / ``restore(rng)``: what it keeps between calls beyond the segment (its
  generator's state), for ``state_dict``.

Subclassing :class:`~shmbuf.samplers.uniform.Uniform` gives the last three. A class of
your own module works the same way (``sampler=MySampler`` or
``sampler="mypackage.mymodule:MySampler"``): every process that attaches imports it by
that path. ``docs/guides/sampling.md`` walks through ``oldest.py`` as the example.

Examples:
    >>> import numpy as np, shmbuf
    >>> buf = shmbuf.Buffer.create({"x": ((), "int64")}, 8, sampler="newest")
    >>> buf.extend({"x": np.arange(5)})
    >>> type(buf.sampler).__name__, buf.sample(3)["x"].tolist(), buf.parts.specs
    ('Newest', [4, 3, 2], {'sampler': {'name': 'newest', 'options': {}}})
    >>> buf.close()
"""

from __future__ import annotations

from shmbuf.samplers.part import DEFAULT, names  # noqa: F401  (the names sampler= takes)
