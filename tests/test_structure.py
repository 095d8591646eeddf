"""The package's shape: stages in folders, one backend seam, no import cycle, small modules.

These tests parse kgrad's source (imports inside functions count too): a
module that imports another at call time still depends on it.
"""

import ast
import functools
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent / "kgrad"

#: Folders (and modules) that never import a backend: they read and write logs,
#: plan what a step computes, report, draw, and run the command line.
BACKEND_FREE = (
    "plan", "logs", "report", "dashboard", "callbacks", "sinks", "cli.py", "demo.py", "demo_folders.py",
    "demo_command.py", "__init__.py", "backends/common",
)
BACKEND_PACKAGES = ("tensorflow", "jax", "torch")

#: Backend-free modules that use TensorFlow where it is installed, and only then:
#: the event file writes to ``gs://`` and TensorFlow's other file systems with ``tf.io.gfile``.
OPTIONAL_TENSORFLOW = {"kgrad.logs.event_file"}

MAX_LINES = 300


def _module_name(path):
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules():
    return {_module_name(path): path for path in sorted(ROOT.rglob("*.py"))}


def _imports(path, modules):
    """The kgrad modules and the outside packages ``path`` imports, anywhere in it."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    inside, outside = set(), set()
    for node in _walk_run_time(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                       for alias in node.names]
        else:
            continue
        for target in targets:
            if target.split(".")[0] == "kgrad":
                if target in modules and target not in (name, "kgrad"):
                    inside.add(target)
            else:
                outside.add(target.split(".")[0])
    return inside, outside


def _walk_run_time(tree):
    """``ast.walk`` without the bodies of ``if typing.TYPE_CHECKING:`` (what IDEs see, never run)."""
    pending = [tree]
    while pending:
        node = pending.pop()
        yield node
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("typing.TYPE_CHECKING", "TYPE_CHECKING"):
            pending.extend(node.orelse)
            continue
        pending.extend(ast.iter_child_nodes(node))


@functools.cache  # the source does not change during a run; 300 tests read it
def _graph():
    modules = _modules()
    return {name: _imports(path, modules) for name, path in modules.items()}


def _cycle(edges):
    """One import cycle as a list of modules, or ``None``."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for target in sorted(edges[node]):
            if state.get(target) == "open":
                return stack[stack.index(target):] + [target]
            if target not in state:
                found = visit(target)
                if found:
                    return found
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(edges):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_cycle_finder_finds_a_cycle_and_accepts_a_tree():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_no_import_cycle_between_kgrad_modules():
    edges = {name: inside for name, (inside, _) in _graph().items()}
    cycle = _cycle(edges)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def _backend_free(name):
    relative = name.removeprefix("kgrad").lstrip(".").replace(".", "/")
    return name == "kgrad" or any(
        relative == free.removesuffix(".py") or relative.startswith(free + "/") for free in BACKEND_FREE
    )


@pytest.mark.parametrize("name", [name for name in _modules() if _backend_free(name)])
def test_backend_free_modules_import_no_backend(name):
    inside, outside = _graph()[name]
    if name in OPTIONAL_TENSORFLOW:
        outside = outside - {"tensorflow"}
    assert not outside & set(BACKEND_PACKAGES), f"{name} imports {outside & set(BACKEND_PACKAGES)}"
    reaching = sorted(target for target in inside if target.startswith("kgrad.backends.")
                      and not target.startswith("kgrad.backends.common"))
    assert not reaching, f"{name} imports backend code: {reaching}"


def test_only_the_backends_own_folder_imports_its_framework():
    for name, (_, outside) in _graph().items():
        for backend in BACKEND_PACKAGES:
            if backend in outside and not (backend == "tensorflow" and name in OPTIONAL_TENSORFLOW):
                assert name.startswith(f"kgrad.backends.{backend}"), f"{name} imports {backend}"


def test_each_backend_package_has_the_stages():
    stages = {"capture", "differentiate", "summarize", "handover", "guard"}
    backends = {path.name: path for path in (ROOT / "backends").iterdir()
                if path.is_dir() and path.name not in ("common", "__pycache__")}
    assert set(backends) == {"tensorflow", "jax"}
    for backend in backends.values():
        assert {child.name for child in backend.iterdir() if child.is_dir()} >= stages, backend
        assert (backend / "backend.py").is_file()


@pytest.mark.parametrize(
    "path", sorted(path for suffix in ("*.py", "*.js", "*.css") for path in ROOT.rglob(suffix)),
    ids=lambda path: str(path.relative_to(ROOT)),
)
def test_no_module_over_300_lines(path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(ROOT)} has {lines} lines; split it by job"
