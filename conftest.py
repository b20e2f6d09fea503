"""Collection rules for the whole checkout (the package's doctests included).

The modules of shmbuf that exist for a library's users import that library at their
top (``shmbuf.compat.sb3`` subclasses stable-baselines3's buffers): their doctests are
collected only where the library is installed (``scripts/test-libraries``)."""

from __future__ import annotations

import importlib.util

collect_ignore_glob = [] if importlib.util.find_spec("stable_baselines3") else ["shmbuf/compat/sb3*.py"]
