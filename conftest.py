"""Collection rules for the whole checkout (the package's doctests included).

The modules of shmbuf that exist for a library's users import that library at their
top (``shmbuf.compat.sb3`` subclasses stable-baselines3's buffers, ``shmbuf.compat.torchrl``
TorchRL's): their doctests are collected only where the library is installed
(``scripts/test-libraries``)."""

from __future__ import annotations

import importlib.util

collect_ignore_glob = [path for path, library in [("shmbuf/compat/sb3*.py", "stable_baselines3"),
                                                 ("shmbuf/compat/torchrl.py", "torchrl")]
                       if importlib.util.find_spec(library) is None]
