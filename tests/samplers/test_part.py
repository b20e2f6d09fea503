"""The sampler as a part (shmbuf/samplers/part.py): names, names with options, a
user's own class recorded by its import path and rebuilt by every process that
attaches, and the errors of each."""

from __future__ import annotations

import multiprocessing as mp

import numpy as np
import pytest

import shmbuf
from helpers import Stride, sample_attached
from shmbuf.samplers import part

X = {"x": ((), "int64")}


def test_a_users_class_is_recorded_by_its_path_and_rebuilt_by_a_process_that_attaches(name):
    with shmbuf.Buffer.create(X, 16, name=name, sampler=(Stride, {"step": 3})) as buf:
        buf.extend({"x": np.arange(10)})
        assert buf.parts.specs == {"sampler": {"class": "helpers.user_sampler:Stride", "options": {"step": 3}}}
        assert buf.sample(3)["x"].tolist() == [0, 3, 6]
        ctx = mp.get_context("spawn")
        mine, theirs = ctx.Pipe()
        p = ctx.Process(target=sample_attached, args=(name, 4, theirs))
        p.start()
        assert mine.recv() == ("Stride", [0, 3, 6, 9], buf.parts.specs)
        p.join(60)
        assert p.exitcode == 0
    with shmbuf.Buffer.create(X, 16, name=name + "s", sampler="helpers.user_sampler:Stride") as by_path:
        by_path.extend({"x": np.arange(4)})
        assert by_path.parts.specs["sampler"]["options"] == {"step": 1} and by_path.sample(2)["x"].tolist() == [0, 1]


def test_its_rows_come_through_the_checked_gather(name):
    """The class only draws: a row it draws that is not intact (here: reserved by a
    writer that died) is drawn again, never returned, and the read path's error
    comes at the timeout."""
    with shmbuf.Buffer.create(X, 16, name=name, sampler=(Stride, {"step": 2})) as buf:
        buf.extend({"x": np.arange(6)})
        buf.engine.ring.stamps[2] = 0  # (row 2 as a writer that died leaves it: not published)
        with pytest.raises(shmbuf.SampleTimeout, match="could not copy 1 intact rows within 0.2 s"):
            buf.sample(3, timeout=0.2)


class Local:  # (defined in a test module: importable, so allowed; see the refusals below)
    pass


def test_a_class_other_processes_cannot_import_is_refused_and_nothing_is_made(name):
    main = type("InMain", (Stride,), {"__module__": "__main__"})

    def inside():
        class Nested(Stride):
            pass
        return Nested
    for bad, match in ((main, "is defined in __main__: other processes attach by importing it"),
                       (inside(), "inside a function: other processes attach by importing it"),
                       ("helpers.user_sampler:Missing", "cannot be imported in this process"),
                       ("no_such_package.mod:Cls", "cannot be imported in this process"),
                       ("helpers.user_sampler:sample_attached", "is not a sampler class"),
                       ("__main__:Stride", "is defined in __main__"), ("builtins:dict", "it lacks sample"),
                       ("shmbuf.samplers.newest:Newest.__base__", "other processes attach by importing it"),
                       ((Stride, {"step": (1, 2)}), "step must be an int"),
                       ((Stride, {"step": 0}), "step must be an int >= 1, got 0"),
                       ((Stride, {"stride": 2}), "takes the option 'step' only"),
                       (("newest", {"k": 1}), "sampler Newest takes no options"),
                       (("newest", [1]), "a sampler's options are a dict of str keys"),
                       ("lifo", "got 'lifo'"), (3, "got 3")):
        with pytest.raises((ValueError, TypeError), match=match):
            shmbuf.Buffer.create(X, 8, name=name, sampler=bad)
        assert name not in shmbuf.core.segment.list_names()


def test_the_default_records_nothing_and_the_keyword_comes_back():
    assert part.spec("uniform") is None and part.spec(("uniform", {})) is None
    assert part.keyword(None) == "uniform" and part.keyword(part.spec("newest")) == "newest"
    spec = part.spec(("helpers.user_sampler:Stride", {"step": 2}))
    assert part.keyword(spec) == ("helpers.user_sampler:Stride", {"step": 2}) and part.spec(part.keyword(spec)) == spec
    assert "uniform" in part.names() and "part" not in part.names()
