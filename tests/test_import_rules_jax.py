"""Import rules of ``kgrad/backends/jax``, read from the source (no backend needed).

- No two folders import each other (``guard`` -> ``own_step`` and back).
- No private (underscore) name is imported from another module, nor read as
  ``module._name`` of an imported kgrad module.

That Keras' private API is reached through ``keras_internals.py`` only is
checked for the whole package, this folder included, in tests/test_import_rules.py.
"""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
JAX = ROOT / "kgrad" / "backends" / "jax"
PACKAGE = "kgrad.backends.jax"
def _modules():
    return sorted(JAX.rglob("*.py"))


def _name(path):
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def _folder(module):
    """The folder of ``kgrad.backends.jax.<folder>.<module>``; ``None`` for a module at the top."""
    parts = module.split(".")
    return parts[3] if len(parts) > 4 else None


def _imports(path):
    """``[(imported module, [names])]`` of the kgrad imports in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("kgrad"):
            found.append((node.module, [alias.name for alias in node.names]))
        elif isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names if alias.name.startswith("kgrad")]
    return found


def _folder_edges():
    edges = {}
    for path in _modules():
        source = _folder(_name(path))
        for module, names in _imports(path):
            targets = [module] + [f"{module}.{name}" for name in names]
            for target in targets:
                if not target.startswith(PACKAGE + "."):
                    continue
                top = target.split(".")[3]
                folder = _folder(target) or (top if (JAX / top).is_dir() else None)
                if source and folder and folder != source:
                    edges.setdefault((source, folder), []).append(_name(path))
    return edges


def test_no_two_jax_folders_import_each_other():
    edges = _folder_edges()
    both_ways = sorted(
        f"{a} <-> {b}: {edges[(a, b)][0]} and {edges[(b, a)][0]}"
        for a, b in edges
        if (b, a) in edges and a < b
    )
    assert not both_ways, "folders of kgrad/backends/jax importing each other:\n" + "\n".join(both_ways)


def test_the_folder_rule_sees_imports():
    # The rule above would pass on a parser that finds nothing: it finds the known edges.
    assert ("guard", "capture") in _folder_edges()


def _private_reads(path):
    tree = ast.parse(path.read_text())
    imported_modules = set()
    private = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("kgrad"):
            for alias in node.names:
                if alias.name.startswith("_"):
                    private.append(f"from {node.module} import {alias.name}")
                elif (ROOT / pathlib.Path(*node.module.split("."), alias.name + ".py")).exists():
                    imported_modules.add(alias.asname or alias.name)
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in imported_modules
            and node.attr.startswith("_")
        ):
            private.append(f"{node.value.id}.{node.attr}")
    return private


@pytest.mark.parametrize("path", _modules(), ids=lambda path: str(path.relative_to(JAX)))
def test_no_private_name_crosses_a_module(path):
    assert _private_reads(path) == []


def test_the_private_rule_sees_a_private_import(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        "from kgrad.backends.jax.guard.trace import _counts\n"
        "from kgrad.backends.jax.guard import trace\n"
        "trace._Recorder\n"
    )
    assert _private_reads(sample) == [
        "from kgrad.backends.jax.guard.trace import _counts", "trace._Recorder"
    ]
