"""The sampler as a part (``Buffer.create(..., sampler=...)``; see :mod:`shmbuf.parts`):
which rows a sample of a replay buffer holds, for every handle.

``sampler=`` takes:

* a name: ``"uniform"`` (the default) or another module of :mod:`shmbuf.samplers`
  with a ``SAMPLER`` (:func:`names`);
* a name and its options: ``("recency", {"tau": 10_000})``;
* a class of your own (or ``(Class, {options})``), recorded by its import path
  ``"package.module:Class"``, which may also be given as that string: every process
  that attaches imports it from there, so it must live in an importable module (not in
  ``__main__``, not inside a function).

The spec recorded is ``{"name": ...}`` or ``{"class": "package.module:Class"}``, with
``"options"``: what the class's ``options(given)`` made of the options given (checked,
JSON-able; a class without ``options`` takes none). The contract a sampler class keeps
is in :mod:`shmbuf.samplers`.

Examples:
    >>> spec(("uniform", {}))
    >>> spec("newest")
    {'name': 'newest', 'options': {}}
    >>> spec("lifo")
    Traceback (most recent call last):
    ...
    ValueError: sampler must be one of [...'uniform'], ("name", {options}), a sampler class or "package.module:Class"; got 'lifo'
"""

from __future__ import annotations

import functools
import importlib
import json
import pkgutil
from typing import Any, Mapping

KEY = KEYWORD = "sampler"
EXCLUDES: dict[str, str] = {}
DEFAULT = "uniform"


def names() -> list[str]:
    """The names ``sampler=`` takes: the modules of :mod:`shmbuf.samplers` with a ``SAMPLER``."""
    package = importlib.import_module("shmbuf.samplers")
    return sorted(m.name for m in pkgutil.iter_modules(package.__path__)
                  if m.name != "part" and hasattr(importlib.import_module(f"shmbuf.samplers.{m.name}"), "SAMPLER"))


def _bad(given: Any, why: str = "") -> ValueError:
    return ValueError(f"sampler must be one of {names()}, (\"name\", {{options}}), a sampler class or "
                      f"\"package.module:Class\"; got {given!r}{why}")


def _path(cls: type) -> str:
    """``cls``'s import path (its name, for a sampler of this folder), if every
    process can import it from there."""
    for name in names():
        if importlib.import_module(f"shmbuf.samplers.{name}").SAMPLER is cls:
            return name
    return _check_path(f"{getattr(cls, '__module__', None)}:{getattr(cls, '__qualname__', '')}")


def _check_path(path: str) -> str:
    """``path`` (``"package.module:Class"``) if another process may import it: not from
    ``__main__`` (each process has its own), not inside a function, no dunder step."""
    module, _, qualname = path.partition(":")
    steps = qualname.split(".")
    if module in ("", "__main__", "None") or module.startswith(".") or "<locals>" in qualname \
            or not all(steps) or any(x.startswith("__") for x in steps):
        where = "inside a function" if "<locals>" in qualname else f"in {module or 'no module'}"
        raise ValueError(f"sampler class {qualname or path!r} is defined {where}: other processes attach by "
                         "importing it, so define it in a module of its own and pass the class or "
                         "\"package.module:Class\"")
    return path


METHODS = ("sample", "update", "state", "restore")
"""What a sampler class has (see the contract in :mod:`shmbuf.samplers`)."""


def resolve(spec_: Mapping[str, Any]) -> type:
    """The sampler class a spec names (imported, for a class recorded by path)."""
    if "name" in spec_:
        if spec_["name"] not in names():
            raise _bad(spec_["name"])
        return importlib.import_module(f"shmbuf.samplers.{spec_['name']}").SAMPLER
    module, _, qualname = _check_path(str(spec_["class"])).partition(":")
    try:
        obj: Any = importlib.import_module(module)
        for step in qualname.split("."):
            obj = getattr(obj, step)
    except Exception as exc:  # (whatever importing it raises: SyntaxError, the module's own errors)
        raise ValueError(f"sampler class {spec_['class']!r} cannot be imported in this process "
                         f"({type(exc).__name__}: {exc}): make its module importable here") from None
    lacks = [m for m in METHODS if not callable(getattr(obj, m, None))]
    if not isinstance(obj, type) or lacks:
        raise ValueError(f"{spec_['class']!r} is not a sampler class ("
                         f"{'it lacks ' + ', '.join(lacks) if lacks else 'not a class'}): see shmbuf.samplers")
    return obj


def _options(cls: type, given: Any) -> dict[str, Any]:
    if not isinstance(given, Mapping) or not all(isinstance(k, str) for k in given):
        raise TypeError(f"a sampler's options are a dict of str keys, got {given!r:.200}")
    check = getattr(cls, "options", None)
    if check is None:
        if given:
            raise ValueError(f"sampler {cls.__qualname__} takes no options, got {dict(given)!r:.200}")
        return {}
    if not callable(check):
        raise ValueError(f"sampler {cls.__qualname__}'s options is not a classmethod (see shmbuf.samplers)")
    made = check(dict(given))
    try:
        same = json.loads(json.dumps(made, allow_nan=False)) == made
    except (TypeError, ValueError):
        same = False
    if not isinstance(made, dict) or not same:
        raise ValueError(f"sampler {cls.__qualname__}'s options() gave {made!r:.200}, not a dict that JSON keeps "
                         "as it is (recorded in the segment, options come back the same: numbers, strings, "
                         "booleans, lists, dicts of str keys; no NaN, no tuples)")
    return made


def spec(sampler: Any) -> dict | None:
    """The spec of ``sampler=`` (None: the default, uniform without options)."""
    given, options = (sampler if isinstance(sampler, tuple) and len(sampler) == 2 else (sampler, {}))
    if isinstance(given, type):
        path = _path(given)
        out = {"class": path} if ":" in path else {"name": path}
    elif isinstance(given, str) and ":" in given:
        out = {"class": _check_path(given)}
    elif isinstance(given, str) and given in names():
        out = {"name": given}
    else:
        raise _bad(sampler)
    out["options"] = _options(resolve(out), options)
    return None if out == {"name": DEFAULT, "options": {}} else out


def keyword(spec_: dict | None) -> Any:
    if spec_ is None:
        return DEFAULT
    what = spec_.get("name", spec_.get("class"))
    return (what, spec_["options"]) if spec_.get("options") else what


def plan(spec_: dict, p: Any) -> None:
    """(A sampler keeps nothing in the segment.)"""


def open(spec_: dict, engine: Any) -> dict[str, Any]:
    cls = resolve(spec_)
    return {"sampler": functools.partial(cls, **_options(cls, spec_.get("options", {})))}
