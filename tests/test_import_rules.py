"""Import rules of kgrad/ outside kgrad/backends/jax (whose own test is tests/test_import_rules_jax.py).

- No two folders import each other (in either direction, at module level or
  inside a function): a folder's modules depend on the other folder or are
  depended on by it, never both.
- No private name (``_x``) of one module is used by another: imported
  (``from m import _x``) or read from an imported module (``m._x``).
"""

import ast
import collections
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "kgrad"
JAX = "kgrad/backends/jax"


def _module_name(path):
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in PACKAGE.rglob("*.py")}


def _folder(module):
    return MODULES[module].parent.relative_to(ROOT).as_posix()


def _imports(source):
    """``[(imported module, name or None, alias)]`` of every kgrad import in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("kgrad"):
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                if submodule in MODULES:
                    found.append((submodule, None, alias.asname or alias.name))
                elif node.module in MODULES:
                    found.append((node.module, alias.name, alias.asname or alias.name))
        elif isinstance(node, ast.Import):
            found += [(alias.name, None, alias.asname) for alias in node.names if alias.name in MODULES]
    return found


def _private_uses(module, source=None):
    """``[(other module, private name)]`` that ``module`` imports or reads from an imported module."""
    source = MODULES[module].read_text() if source is None else source
    imports = _imports(source)
    uses = [(target, name) for target, name, _ in imports if name and _is_private(name) and target != module]
    modules_by_alias = {alias: target for target, name, alias in imports if name is None and alias}
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in modules_by_alias and _is_private(node.attr)):
            uses.append((modules_by_alias[node.value.id], node.attr))
    return uses


def _is_private(name):
    return name.startswith("_") and not name.startswith("__")


CHECKED = sorted(module for module in MODULES if not _folder(module).startswith(JAX))


def _folder_edges(sources=None):
    """``{folder: {(other folder, module, imported module)}}``.

    ``sources``: ``{module: source}``, by default the files.
    """
    sources = sources or {module: MODULES[module].read_text() for module in CHECKED}
    edges = collections.defaultdict(set)
    for module, source in sources.items():
        for target, _, _ in _imports(source):
            if _folder(target) != _folder(module) and not _folder(target).startswith(JAX):
                edges[_folder(module)].add((_folder(target), module, target))
    return edges


def _both_ways(edges):
    return sorted(
        (folder, other, module, target, [(m, t) for o, m, t in edges.get(other, ()) if o == folder][:3])
        for folder in edges for other, module, target in edges[folder]
        if folder < other and any(o == folder for o, _, _ in edges.get(other, ()))
    )


def test_no_two_folders_import_each_other():
    assert _both_ways(_folder_edges()) == []


def test_the_folder_check_sees_the_imports():
    # It cannot pass by finding nothing: the callbacks import the plan, the backends the plan.
    edges = _folder_edges()
    assert any(other == "kgrad/plan" for other, _, _ in edges["kgrad/callbacks"])
    assert any(other == "kgrad/plan" for other, _, _ in edges["kgrad/backends/tensorflow/guard"])


@pytest.mark.parametrize("module", CHECKED)
def test_no_private_name_is_used_across_modules(module):
    assert _private_uses(module) == []


def test_the_private_check_finds_a_private_use():
    source = ("from kgrad.plan import options\nfrom kgrad.plan.options import _check_kinds\n"
              "options._check_positive_int(1)\noptions.ProbeConfig()\n")
    assert sorted(_private_uses("kgrad.plan.selection", source)) == [
        ("kgrad.plan.options", "_check_kinds"), ("kgrad.plan.options", "_check_positive_int")]


def test_the_folder_check_finds_a_loop(monkeypatch):
    # The report's HTML module importing the tab while the tab imports the report was such a loop.
    monkeypatch.setitem(MODULES, "kgrad.report.html_example", PACKAGE / "report" / "html_example.py")
    sources = {module: MODULES[module].read_text() for module in CHECKED}
    sources["kgrad.report.html_example"] = "from kgrad.dashboard import views\n"
    loops = _both_ways(_folder_edges(sources))
    assert {loop[:2] for loop in loops} == {("kgrad/dashboard", "kgrad/report")}


KERAS_INTERNALS = (
    "kgrad.backends.common.keras_internals",
    "kgrad.backends.tensorflow.keras_internals",
    "kgrad.plan.keras_internals",
)
#: Keras' private methods called outside JAX (a keras_internals module wraps each).
KERAS_PRIVATE = ("_flatten_layers",)


def _keras_src_imports(source):
    """The ``keras.src`` modules ``source`` imports, and the private Keras methods it calls."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("keras.src"):
            found.append(node.module)
        elif isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if alias.name.startswith("keras.src")]
        elif isinstance(node, ast.Attribute) and node.attr in KERAS_PRIVATE:
            found.append(node.attr)
    return found


@pytest.mark.parametrize("module", [module for module in CHECKED if module not in KERAS_INTERNALS])
def test_keras_internals_are_reached_through_one_module(module):
    # A Keras release is one file to check per backend (kgrad/backends/jax has its own).
    assert _keras_src_imports(MODULES[module].read_text()) == []


def test_the_keras_internals_check_finds_an_import():
    source = "from keras.src.models.functional import Functional\nlayer._flatten_layers()\n"
    assert sorted(_keras_src_imports(source)) == ["_flatten_layers", "keras.src.models.functional"]
