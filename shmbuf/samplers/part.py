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
    """``cls``'s import path, if every process can import it from there."""
    module, qualname = getattr(cls, "__module__", None), getattr(cls, "__qualname__", "")
    if module in (None, "__main__") or "<locals>" in qualname:
        raise ValueError(f"sampler class {qualname or cls!r} is defined in {module or 'no module'}"
                         f"{' inside a function' if '<locals>' in qualname else ''}: other processes attach "
                         "by importing it, so define it in a module of its own (package.module:Class)")
    return f"{module}:{qualname}"


def resolve(spec_: Mapping[str, Any]) -> type:
    """The sampler class a spec names (imported, for a class recorded by path)."""
    if "name" in spec_:
        if spec_["name"] not in names():
            raise _bad(spec_["name"])
        return importlib.import_module(f"shmbuf.samplers.{spec_['name']}").SAMPLER
    module, _, qualname = str(spec_["class"]).partition(":")
    try:
        obj: Any = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ValueError(f"sampler class {spec_['class']!r} cannot be imported in this process ({exc}): "
                         "make its module importable here (installed, or on sys.path)") from None
    if not isinstance(obj, type):
        raise ValueError(f"sampler {spec_['class']!r} is a {type(obj).__name__}, not a class")
    return obj


def _options(cls: type, given: Any) -> dict[str, Any]:
    if not isinstance(given, Mapping) or not all(isinstance(k, str) for k in given):
        raise TypeError(f"a sampler's options are a dict of str keys, got {given!r:.200}")
    check = getattr(cls, "options", None)
    if check is None:
        if given:
            raise ValueError(f"sampler {cls.__qualname__} takes no options, got {dict(given)!r:.200}")
        return {}
    return check(dict(given))


def spec(sampler: Any) -> dict | None:
    """The spec of ``sampler=`` (None: the default, uniform without options)."""
    given, options = (sampler if isinstance(sampler, tuple) and len(sampler) == 2 else (sampler, {}))
    if isinstance(given, type):
        out = {"class": _path(given)}
    elif isinstance(given, str) and ":" in given:
        out = {"class": given}
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
