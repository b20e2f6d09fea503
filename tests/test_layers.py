"""The package's shape, checked from its source: layers, cycles, private names, sizes.

Every import counts, type-only (``if TYPE_CHECKING:``) and function-level ones too:
a cycle through a type-only import is still two modules that each need the other.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

pytestmark = pytest.mark.one_path

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "shmbuf"

# Lowest first: each layer is folders of the package (and the few modules that stand
# directly in it). A module may import its own layer's modules (without a cycle) and
# any layer below, never one above. The first entry that is a prefix of a module's
# dotted name places it.
LAYERS = [
    ["shmbuf.core", "shmbuf.version"],                    # the engine: one segment and its protocol
    ["shmbuf.samplers", "shmbuf.priority", "shmbuf.queue", "shmbuf.versions", "shmbuf.limited",
     "shmbuf.rate", "shmbuf.ragged"],                                      # capabilities: samplers and the parts they replace
    ["shmbuf.parts"],                                     # the registry of parts
    ["shmbuf.persist"],                                   # saves
    ["shmbuf.buffer"],                                    # the Buffer handle and its parts
    ["shmbuf.episodes"],                                  # episodes, their samplers and HER on Buffer
    ["shmbuf.actors", "shmbuf.demo", "shmbuf.torch", "shmbuf.hdf5", "shmbuf.spaces"],  # processes, interop
    ["shmbuf.compat", "shmbuf.ray"],                      # other libraries' APIs
    ["shmbuf.cli", "shmbuf.__main__"],                    # the command line
]
TOP = "shmbuf"  # the package itself (its __init__: the public names) sits above all but the programs
TOP_MODULES = 6  # modules directly in shmbuf/ (its __init__ and __main__ included): the rest are folders
MAX_LINES = 450
MAX_C_LINES = 700


def modules() -> dict[str, pathlib.Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports(name: str, path: pathlib.Path, known: dict[str, pathlib.Path]) -> list[tuple[str, list[str], int]]:
    """(module imported, names imported from it, line) for every import in the file."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith(TOP):
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                if sub in known or (target + "." + alias.name).endswith("._native"):
                    found.append((sub, [], node.lineno))  # a module imported by name
                else:
                    found.append((target, [alias.name], node.lineno))
        elif isinstance(node, ast.Import):
            found += [(a.name, [], node.lineno) for a in node.names if a.name.startswith(TOP)]
    return found


def layer(name: str) -> int:
    if name == TOP:
        return len(LAYERS) - 1.5  # above the libraries' APIs, below the command line
    for i, prefixes in enumerate(LAYERS):
        if any(name == p or name.startswith(p + ".") for p in prefixes):
            return i
    raise AssertionError(f"module {name} is in no layer of tests/test_layers.py: add it to LAYERS")


def graph() -> dict[str, set[str]]:
    known = modules()
    edges: dict[str, set[str]] = {m: set() for m in known}
    for name, path in known.items():
        for target, _, _ in imports(name, path, known):
            if target in known and target != name:
                edges[name].add(target)
    return edges


def test_every_module_is_in_a_layer_and_imports_only_its_own_or_lower_layers():
    known = modules()
    upward = []
    for name, path in sorted(known.items()):
        mine = layer(name)
        for target, _, line in imports(name, path, known):
            if target in known and target != name and layer(target) > mine:
                upward.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {name} imports {target} (a layer above)")
    assert not upward, "\n".join(upward)


def test_no_import_cycle_type_only_imports_included():
    edges = graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                cycles.append(sorted(part))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def test_no_private_name_is_imported_from_another_module():
    known = modules()
    bad = []
    for name, path in sorted(known.items()):
        for target, names, line in imports(name, path, known):
            private = [n for n in names if n.startswith("_") and not n.startswith("__")]
            if target.rpartition(".")[2].startswith("_") and target.rpartition(".")[2] != "_native":
                private.append(target)
            if private:
                bad.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {name} imports {private} from {target}")
    assert not bad, "\n".join(bad)


def test_few_reaches_into_other_objects_private_attributes():
    """``x._name`` where ``x`` is not ``self``/``cls``: a part using another's insides.
    The few left are listed here, each with its reason, and no new one may come."""
    allowed = {
        "tl._is_owned", "lock._is_owned",  # threading.RLock's own-thread test (no public one)
        "super()._wrap",  # a facade's subclass extends its parent's constructor step
        "trl._rb",  # the benchmark reads TorchRL's storage to size it
    }
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                    continue
                text = ast.unparse(node)
                if text not in allowed:
                    found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {text}")
    assert len(found) <= 10, "\n".join(found)


def test_no_module_is_longer_than_its_limit():
    long = [f"{p.relative_to(PACKAGE.parent)}: {n} lines" for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES]
    long += [f"{p.relative_to(PACKAGE.parent)}: {n} lines" for p in PACKAGE.rglob("*.[ch]")
             if (n := len(p.read_text().splitlines())) > MAX_C_LINES]
    assert not long, "\n".join(sorted(long))


def test_the_layers_are_folders():
    """Every layer entry is a folder of the package or a module directly in it, every
    folder is in a layer, and only a few modules stand outside a folder."""
    entries = [e for layer in LAYERS for e in layer]
    for e in entries:
        rel = pathlib.Path(*e.split(".")[1:])
        assert (PACKAGE / rel).is_dir() or (PACKAGE / rel).with_suffix(".py").is_file(), e
    folders = sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").is_file())
    assert [f for f in folders if f"{TOP}.{f}" not in entries] == []
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= TOP_MODULES, top


# The ring's tables (its lane table, stamps, field arrays, control words) are the core's.
# Outside it, these files alone read them, each for its reason; everything else asks the
# engine (window, heads, bases, view, published, gather, read).
RING_READERS = {
    "shmbuf/episodes/gather.py": "the episodes' reads: checked copies of named fields, and the raw reads "
                                 "that guide them (where an episode starts and ends, the counts)",
    "shmbuf/episodes/writer.py": "the episode writer numbers episodes in the lane table of the lanes it holds",
}
RING_TABLES = {"lane_table", "stamps", "arrays", "control", "res", "res_pid", "rows"}
# The parts the engine holds (shmbuf/core/plain.py) are given the ring itself: those of the
# capabilities, in their folders, are the protocol's steps as the core's are.
PARTS_ON_THE_RING = {
    "shmbuf/queue/": "a queue's write part: its words, the lanes' frontiers, its takes' stamps and rows",
    "shmbuf/rate/": "the rate gate: the counts of rows inserted (the lanes' heads) and sampled (a control word)",
    "shmbuf/limited/counted.py": "the write part of max_times_sampled=: its stats() scans the rows' counts",
}


def test_the_ring_tables_are_read_in_the_core_and_in_the_files_named_here():
    found = set()
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE.parent).as_posix()
        if rel.startswith(("shmbuf/core/",) + tuple(PARTS_ON_THE_RING)):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in RING_TABLES \
                    and ast.unparse(node.value).split(".")[-1] == "ring":
                found.add(rel)
    assert sorted(found - set(RING_READERS)) == []
    assert len(RING_READERS) <= 3 and len(PARTS_ON_THE_RING) <= 3


def test_the_storage_is_chosen_in_one_place():
    """Only shmbuf/core/storage.py looks at a name to tell a file from a segment."""
    calls = []
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE.parent).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and ast.unparse(node.func).split(".")[-1] == "is_path":
                calls.append(rel)
    assert calls == ["shmbuf/core/storage.py"]


def test_no_capability_is_a_none_flag_on_the_engine():
    """A capability is a part the engine holds (shmbuf/core/plain.py), never an attribute
    that is None when the capability is off."""
    import re
    flag = re.compile(r"engine\.(priorities|writes|gate|trees|queue)\s+is\s+(not\s+)?None")
    found = [f"{p.relative_to(PACKAGE.parent)}: {m.group(0)}" for p in PACKAGE.rglob("*.py")
             for m in flag.finditer(p.read_text())]
    assert found == []


def test_one_read_loop():
    """Every sampler is driven by shmbuf.core.read.read: no other module defines a redraw
    loop of its own (a function named like a fill, or the old until_filled)."""
    found = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and "fill" in node.name:
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {node.name}")
            if isinstance(node, ast.Name) and node.id == "until_filled":
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: until_filled")
    assert found == []
