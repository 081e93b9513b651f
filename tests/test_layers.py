"""The package's floors (``cmasd.core.FLOORS``): every import of every module of cmasd,
read with ``ast`` (function-level imports too; ``if TYPE_CHECKING:`` blocks left out: they
never run), goes to its own room or down a floor, never up or sideways; the library never
imports ``fairseq_plugins`` (the plugins import cmasd); and no two folders of cmasd import
each other, through any chain (the folder graph has no cycle). In process, no models: a
second."""

import ast
from pathlib import Path
from typing import Dict, Iterator, List, Set, Tuple

import pytest

from cmasd.core import FLOORS

PACKAGE = Path(__file__).resolve().parent.parent / "cmasd"
PROGRAMS = "cmasd.tools"  # may import fairseq_plugins, as fairseq-generate --user-dir does


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES: Dict[str, Path] = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def place(module: str) -> Tuple[int, str]:
    """(floor, room) of ``module``: the longest room prefix that names it."""
    best = None
    for floor, rooms in enumerate(FLOORS):
        for room in rooms:
            for prefix in (room if isinstance(room, tuple) else (room,)):
                if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > best[0]):
                    best = (len(prefix), floor, str(room))
    assert best is not None, f"{module}: on no floor of cmasd.core.FLOORS"
    return best[1], best[2]


def is_type_checking(node: ast.AST) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports(tree: ast.AST, module: str) -> Iterator[Tuple[int, str]]:
    """(line, imported module) of every import that runs."""
    for node in ast.iter_child_nodes(tree):
        if is_type_checking(node):
            yield from (item for child in node.orelse for item in imports(child, module))
            continue
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's package
                package = module.split(".")
                package = package[: len(package) - node.level + (MODULES[module].name == "__init__.py")]
                base = ".".join(package + ([base] if base else []))
            # ``from cmasd.layers import extension`` imports the module cmasd.layers.extension
            for alias in node.names:
                name = f"{base}.{alias.name}"
                yield node.lineno, name if name in MODULES else base
        yield from imports(node, module)


def violations() -> List[str]:
    found = []
    for module, path in MODULES.items():
        floor, room = place(module)
        for line, target in sorted(set(imports(ast.parse(path.read_text(), str(path)), module))):
            where = f"{path.name}:{line}: {module} imports {target}"
            if target.split(".")[0] == "fairseq_plugins" and not module.startswith(PROGRAMS):
                found.append(f"{where}: the library never imports the plugins")
            if target.split(".")[0] != "cmasd" or target == "cmasd":
                continue
            their_floor, their_room = place(target)
            if their_floor > floor:
                found.append(f"{where}: up from floor {floor} to {their_floor}")
            elif their_floor == floor and their_room != room:
                found.append(f"{where}: sideways on floor {floor}, {room} -> {their_room}")
    return found


def folder(module: str) -> str:
    """The node of ``module`` in the folder graph: its folder ``cmasd.<folder>``; a module at
    the top of the package (``cmasd.errors``, ``cmasd.options``, ...) is a node of its own."""
    return ".".join(module.split(".")[:2])


def folder_graph() -> Dict[str, Set[str]]:
    """folder -> the other folders its modules import (the imports that run, as above; the
    package's own ``__init__``, which may reach anything lazily, left out)."""
    graph: Dict[str, Set[str]] = {}
    for module, path in MODULES.items():
        if module == "cmasd":
            continue
        for _, target in imports(ast.parse(path.read_text(), str(path)), module):
            if target.split(".")[0] == "cmasd" and target != "cmasd" and folder(target) != folder(module):
                graph.setdefault(folder(module), set()).add(folder(target))
    return graph


def folder_cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """One cycle (``[a, b, ..., a]``) for each edge that closes one, by depth-first search."""
    found, state, path = [], {}, []  # state: 1 on the current path, 2 finished

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for after in sorted(graph.get(node, ())):
            if state.get(after) == 1:
                found.append(path[path.index(after):] + [after])
            elif after not in state:
                visit(after)
        path.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return found


def test_every_module_is_on_a_floor():
    for module in MODULES:
        place(module)


def test_imports_only_go_down():
    assert violations() == []


@pytest.mark.parametrize("source, wanted", [
    ("from cmasd.decoding.generator import SpeculativeGenerator", "up from floor"),
    ("from cmasd.verification.base import Needs", "sideways"),
    ("import fairseq_plugins", "never imports the plugins"),
])
def test_a_bad_import_is_caught(tmp_path, monkeypatch, source, wanted):
    """A drafter that imported the loop, a rule, or the plugins would fail the test."""
    bad = tmp_path / "bad.py"
    bad.write_text(f"def f():\n    {source}\n")
    monkeypatch.setitem(MODULES, "cmasd.drafters.bad", bad)
    found = [v for v in violations() if "cmasd.drafters.bad" in v]
    assert len(found) == 1 and wanted in found[0]


def test_the_ground_floor_stands_on_errors_alone():
    """``cmasd.core`` (the contracts, their records, sampling and per-sentence randomness)
    imports nothing of cmasd but itself and ``cmasd.errors``; ``cmasd.verification.sampling``
    is its old address, re-exporting the same objects."""
    import cmasd.core.sampling as core
    import cmasd.verification.sampling as old

    for module, path in MODULES.items():
        if module == "cmasd.core" or module.startswith("cmasd.core."):
            for line, target in imports(ast.parse(path.read_text(), str(path)), module):
                if target.split(".")[0] == "cmasd" and target != "cmasd":
                    assert target.startswith("cmasd.core") or target == "cmasd.errors", f"{module}:{line}: {target}"
    assert old.RowRandom is core.RowRandom and old.Sampling is core.Sampling and old.draw is core.draw
    assert place("cmasd.core.sampling")[0] < place("cmasd.verification.sampling")[0]


def test_no_two_folders_import_each_other():
    """A folder is a floor (or, ``cmasd.layers``, two adjacent ones): its modules' imports
    between folders only go down, so the folder graph has no cycle."""
    graph = folder_graph()
    assert "cmasd.drafters" in graph["cmasd.decoding"] and "cmasd.layers" in graph["cmasd.drafters"]  # read, not empty
    assert folder_cycles(graph) == []


def test_a_folder_cycle_is_caught(tmp_path, monkeypatch):
    """A module of the drafters that imported the loop would close drafters -> decoding ->
    drafters (even lazily, inside a function)."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from cmasd.decoding.generator import SpeculativeGenerator\n")
    monkeypatch.setitem(MODULES, "cmasd.drafters.bad", bad)
    cycles = folder_cycles(folder_graph())
    assert cycles and all(set(cycle) >= {"cmasd.drafters", "cmasd.decoding"} for cycle in cycles)


def test_the_arithmetic_does_not_import_its_backends(tmp_path, monkeypatch):
    """In ``cmasd.layers`` the arithmetic (``transformer``) is the floor under the prepared
    modules: importing one of them from it goes up."""
    bad = tmp_path / "transformer.py"
    bad.write_text("def f():\n    from cmasd.layers.cache import BlockScorer\n")
    monkeypatch.setitem(MODULES, "cmasd.layers.transformer", bad)
    found = [v for v in violations() if "cmasd.layers.transformer imports" in v]
    assert len(found) == 1 and "up from floor" in found[0]
