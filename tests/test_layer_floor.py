"""cmasd.layers (the layer arithmetic and, above it, its decoding backends: the prepared
decoder, kernels and cache) is under the drafters and the decoding loop and beside the
models: it imports none of them, and the models (training) import the layer arithmetic from
it, not from the loop."""

import ast
from pathlib import Path

import pytest

CMASD = Path(__file__).resolve().parent.parent / "cmasd"


def cmasd_imports(path: Path) -> set:
    """The cmasd modules a file imports, at any depth of its code."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name.split(".")[0] == "cmasd"}


@pytest.mark.parametrize("path", sorted((CMASD / "layers").glob("*.py")), ids=lambda p: p.name)
def test_the_layers_import_nothing_above_them(path):
    above = ("cmasd.models", "cmasd.decoding", "cmasd.drafters", "cmasd.verification", "cmasd.training", "cmasd.tools")
    assert not [name for name in cmasd_imports(path) if name.startswith(above)]


@pytest.mark.parametrize("path", sorted((CMASD / "models").glob("*.py")), ids=lambda p: p.name)
def test_the_models_do_not_import_the_decoding_loop(path):
    assert not [name for name in cmasd_imports(path) if name.startswith(("cmasd.decoding", "cmasd.drafters"))]
