"""The engine: one shared-memory segment (or file) and the protocol every layer above uses.

Lowest first: :mod:`procs` (process identity), :mod:`segment` and :mod:`files` (the two
storages) chosen by :mod:`storage`, :mod:`layout` and :mod:`schema` (where everything
lies), :mod:`lock` and :mod:`interrupts` (the header lock, Ctrl-C held off around it),
:mod:`ring` with :mod:`claims` and :mod:`tables` (reserve, write, publish), :mod:`durable`
(a file's horizon and rollback), :mod:`native` (the optional C path), :mod:`read` and
:mod:`sampling` (the one read path and the checked gather), :mod:`queue` and :mod:`takes`,
:mod:`ratelimit`, :mod:`counters` and :mod:`stats`, :mod:`state` (copies and restores),
:mod:`parts` (the plain parts a capability replaces), :mod:`engine` (one handle, wired).
Nothing here imports anything above ``shmbuf.core``.
"""
