"""The engine: one shared-memory segment and the protocol that every capability uses.

Modules, lowest first: :mod:`procs` (process identity), :mod:`segment` (the named
segment), :mod:`layout` (where everything lies in it), :mod:`lock` (the header lock),
:mod:`validate` (argument checks), :mod:`native` (the optional C path), :mod:`ring`
(reserve, write, publish), :mod:`sampling` (draws and the checked gather),
:mod:`ratelimit` (the rate gate), :mod:`engine` (one handle's parts, wired).
Nothing here imports anything above ``shmbuf.core``.
"""
