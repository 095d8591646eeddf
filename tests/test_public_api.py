"""The public API: every name in `kgrad.__all__` imports and is documented."""

import doctest
import importlib
import inspect
import pathlib
import re
import subprocess
import sys

import pytest

import kgrad

PACKAGE_DIR = pathlib.Path(kgrad.__file__).parent


def test_all_is_unique_and_public():
    assert len(set(kgrad.__all__)) == len(kgrad.__all__)
    assert all(not name.startswith("_") for name in kgrad.__all__)


@pytest.mark.parametrize("name", kgrad.__all__)
def test_name_imports_from_kgrad(name):
    namespace = {}
    exec(f"from kgrad import {name}", namespace)
    assert namespace[name] is getattr(kgrad, name)


def _constant_comment(name):
    """The ``#:`` comment above ``NAME = ...`` in kgrad's sources, if any."""
    pattern = re.compile(rf"((?:^#:.*\n)+)^{re.escape(name)}\s*[:=]", re.MULTILINE)
    for path in PACKAGE_DIR.rglob("*.py"):
        match = pattern.search(path.read_text())
        if match:
            return match.group(1)
    return None


@pytest.mark.parametrize("name", kgrad.__all__)
def test_name_has_a_docstring_with_an_example(name):
    value = getattr(kgrad, name)
    if not (inspect.isclass(value) or inspect.isfunction(value)):
        # Constants cannot carry a docstring: a `#:` comment documents them.
        assert _constant_comment(name), f"kgrad.{name} needs a '#:' comment above it"
        return
    docstring = inspect.getdoc(value) or ""
    assert docstring.strip(), f"kgrad.{name} has no docstring"
    assert "Example" in docstring and ">>>" in docstring, f"kgrad.{name}'s docstring has no example"


FOUNDATION = ["ProbeTape", "ProbeResult", "tap", "prediction_gradient"]


@pytest.mark.parametrize("name", FOUNDATION)
def test_foundation_examples_run(name):
    value = getattr(kgrad, name)
    module = importlib.import_module(value.__module__)
    tests = doctest.DocTestFinder().find(value, name, module=module, globs={})
    examples = [test for test in tests if test.examples]
    assert examples
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for test in examples:
        runner.run(test)
    assert runner.failures == 0


def test_names_load_lazily_and_dir_lists_them():
    # kgrad/__init__.py maps each public name to its module (PEP 562).
    assert sorted(kgrad._MODULES) == sorted(kgrad.__all__)
    assert set(kgrad.__all__) <= set(dir(kgrad))
    assert kgrad.plan.tag_names.MOMENT_NAMES[0] == "norm"  # submodules too
    with pytest.raises(AttributeError, match="module 'kgrad' has no attribute 'nope'"):
        kgrad.nope  # noqa: B018


def test_import_kgrad_does_not_import_tensorflow():
    code = (
        "import sys, kgrad, kgrad.cli\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'keras')))\n"
        "kgrad.ProbeTape\n"
        "print('tensorflow' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["[]", "True"]
