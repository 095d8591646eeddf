"""Import rules of kgrad/ outside kgrad/backends/jax (whose own test is tests/test_import_rules_jax.py).

- No two folders import each other (in either direction, at module level or
  inside a function): a folder's modules depend on the other folder or are
  depended on by it, never both.
- No private name (``_x``) of one module is used by another: imported
  (``from m import _x``) or read from an imported module (``m._x``).
- In the whole package, kgrad/backends/jax included, Keras' private API
  (``keras.src`` imports, underscored attributes of Keras' objects) is reached
  only through the ``keras_internals`` modules: a Keras release is one file to
  check per backend.
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


#: The modules through which kgrad reaches Keras beyond its public API, one per backend and one
#: each for the backend-free plan and the code the backends share.
KERAS_INTERNALS = (
    "kgrad.backends.common.keras_internals",
    "kgrad.backends.jax.keras_internals",
    "kgrad.backends.tensorflow.keras_internals",
    "kgrad.plan.keras_internals",
)
#: Underscored names that are the public API of Python itself (a named tuple's).
PYTHON_API = {"_replace", "_asdict", "_fields", "_make"}


def _docstrings(tree):
    return {
        id(node.body[0].value) for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)
    }


def _private_names_read(source):
    """``[(name, line, spelled_as_a_string)]``, by line: the private attributes ``source`` reads or
    writes, and the private names it spells as strings (``getattr(x, "_name")``)."""
    tree = ast.parse(source)
    docstrings = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _is_private(node.attr):
            found.append((node.attr, node.lineno, False))
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
              and node.value.isidentifier() and _is_private(node.value)):
            found.append((node.value, node.lineno, True))
    return sorted(found, key=lambda use: use[1])


def _own_names(source):
    """The private names ``source`` defines: functions, classes, variables, attributes of ``self``."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
              and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
            names.add(node.attr)
        elif isinstance(node, ast.alias) and node.asname:
            names.add(node.asname)
    return {name for name in names if _is_private(name)}


def _keras_src_imports(source):
    """The ``keras.src`` modules ``source`` imports."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("keras.src"):
            found.append(node.module)
        elif isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if alias.name.startswith("keras.src")]
    return found


OUTSIDE_KERAS_INTERNALS = sorted(
    module for module in MODULES if not any(module.startswith(internal) for internal in KERAS_INTERNALS)
)
#: The private names kgrad defines itself (outside the keras_internals modules).
KGRAD_PRIVATE = set().union(*(_own_names(MODULES[module].read_text()) for module in OUTSIDE_KERAS_INTERNALS))
#: Keras' private names kgrad uses, collected from the keras_internals modules: a name one of
#: them starts to read is checked everywhere else at once.
KERAS_PRIVATE = {
    name for module in MODULES if module.startswith(KERAS_INTERNALS)
    for name, _, _ in _private_names_read(MODULES[module].read_text())
}


def _keras_private_uses(source, kgrad_private=None):
    """What of Keras' private API ``source`` reaches: ``keras.src`` imports, and ``(name, line)`` of
    each private name it reads that a keras_internals module reads (as an attribute or a string),
    or an attribute of a name kgrad does not define."""
    kgrad_private = KGRAD_PRIVATE if kgrad_private is None else kgrad_private
    own = _own_names(source)
    return _keras_src_imports(source) + [
        (name, line) for name, line, string in _private_names_read(source)
        if name in KERAS_PRIVATE and name not in own
        or not string and name not in kgrad_private | PYTHON_API
    ]


@pytest.mark.parametrize("module", OUTSIDE_KERAS_INTERNALS)
def test_keras_internals_are_reached_through_one_module(module):
    # A Keras release is one file to check per backend.
    assert _keras_private_uses(MODULES[module].read_text()) == [], (
        f"reach Keras' private API from {module} through a keras_internals module "
        f"({', '.join(KERAS_INTERNALS)})"
    )


def test_the_keras_names_are_collected_from_the_keras_internals_modules():
    # It cannot pass by collecting nothing: the names each backend is known to use are there.
    known = {"_flatten_layers", "_compute_loss", "_get_jax_state", "_clip_gradients", "_momentums",
             "_velocity_hats", "_keras_mask", "_get_logits", "_compute_attention", "_compile_loss",
             "_update_metrics_variables", "_get_state_sharding_spec", "_call_has_training_arg",
             "_get_variable_index"}
    assert known <= KERAS_PRIVATE
    assert not KERAS_PRIVATE & PYTHON_API


def test_the_keras_internals_check_finds_each_kind_of_use():
    source = (
        "from keras.src.models.functional import Functional\n"
        "layer._flatten_layers()\n"  # a name keras_internals reads
        "hat = optimizer._velocity_hats[0]\n"
        "first = getattr(optimizer, '_momentums')\n"  # spelled as a string
        "model._not_a_kgrad_name\n"  # a private name kgrad does not define
        "self._iterations = 0\n"  # kgrad's own attribute, though Keras has one of that name too
        "self._iterations\n"
        "state._replace(step=1)\n"  # a named tuple's API
        "self._compute_loss(x=x)\n"  # a subclass of a Keras class calling Keras' private method
    )
    assert _keras_private_uses(source) == [
        "keras.src.models.functional", ("_flatten_layers", 2), ("_velocity_hats", 3), ("_momentums", 4),
        ("_not_a_kgrad_name", 5), ("_compute_loss", 9),
    ]
