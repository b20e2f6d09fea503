"""The engine: one shared-memory segment (or file) and the protocol every layer above uses.

Lowest first: :mod:`procs` (process identity), :mod:`segment` and :mod:`files` (the two
storages) chosen by :mod:`storage`, :mod:`layout` and :mod:`schema` (where everything
lies), :mod:`lock` and :mod:`interrupts` (the header lock, Ctrl-C held off around it),
:mod:`ring` with :mod:`claims` and :mod:`tables` (reserve, write, publish), :mod:`durable`
(a file's horizon and rollback), :mod:`native` (the optional C path), :mod:`read` and
:mod:`gather` (the one read path and the checked gather), :mod:`counters` and
:mod:`report` (``stats()``), :mod:`contents` (copies and restores), :mod:`plain` (the
plain parts a capability replaces, the open rate gate among them), :mod:`engine` (one
handle, wired). The capabilities live above, each in its folder: ``shmbuf.queue``,
``shmbuf.rate``, ``shmbuf.limited``, ``shmbuf.versions``, ``shmbuf.priority``.
Nothing here imports anything above ``shmbuf.core`` (but the engine, until the registry
of parts chooses its write part and rate gate).
"""
