"""Where the test time goes, in CPU seconds: robust on a machine other runs load.

Opt-in (the repository's conftest.py loads this plugin when the variable is set)::

    KGRAD_TEST_CPU_TIMES=/tmp/tf.json python -m pytest -p no:cacheprovider
    python tests/cpu_times.py /tmp/tf.json --top 20

Each test's setup, call and teardown are timed in CPU seconds of this process
(``time.process_time``: every thread, so TensorFlow's and XLA's pools count)
plus those of its finished subprocesses (``RUSAGE_CHILDREN``: a training run
killed on purpose, a TensorBoard server reaped at a fixture's teardown; and each
fork of tests/forked_python.py's server as it ends, an example script or a
page's blocks). Wall seconds are kept beside them, but on a shared machine only
the CPU seconds mean something: another run's load stretches the wall time, not
the CPU time. A module-scoped fixture is charged to the setup of the
first test that asks for it. Under pytest-xdist each worker writes its own file,
``<name>.<worker>.json``; under ``KERAS_BACKEND=jax``, ``<name>.jax[.<worker>].json``, so that
both halves of the README's test command, run with one value, keep their files.
"""

import argparse
import collections
import json
import os
import resource
import sys
import time

import pytest

VARIABLE = "KGRAD_TEST_CPU_TIMES"


def _clocks():
    """(own CPU seconds, finished children's CPU seconds, wall seconds) so far."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    children = children.ru_utime + children.ru_stime
    # The forks of tests/forked_python.py's server, as they end (not when the server ends).
    forked_python = sys.modules.get("forked_python")
    if forked_python is not None:
        children += forked_python.cpu_seconds_of_forks()
    return time.process_time(), children, time.perf_counter()


def _elapsed(start):
    own, children, wall = (now - then for now, then in zip(_clocks(), start))
    return {"cpu": round(own, 3), "children_cpu": round(children, 3), "wall": round(wall, 3)}


class CpuTimes:
    """The plugin: records each test phase's clocks and writes them when the session ends."""

    def __init__(self, path):
        self.path = path
        self.tests = {}
        self.collection = None
        self.session_start = _clocks()
        self.written = time.perf_counter()

    def _timed(self, item, phase):
        start = _clocks()
        yield
        self.tests.setdefault(item.nodeid, {})[phase] = _elapsed(start)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_collection(self, session):
        start = _clocks()
        yield
        self.collection = _elapsed(start)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_setup(self, item):
        yield from self._timed(item, "setup")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item):
        yield from self._timed(item, "call")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_teardown(self, item):
        yield from self._timed(item, "teardown")
        # Every 10 s, what is measured so far: a run stopped early still leaves its ranking.
        if time.perf_counter() - self.written > 10:
            self.write()

    def pytest_sessionfinish(self, session):
        self.write()

    def write(self):
        """Writes the record so far (replacing the file at once: a reader never sees half of it)."""
        own, children, _ = _clocks()
        record = {
            # Since the process started: imports and collection included.
            "process": {"cpu": round(own, 3), "children_cpu": round(children, 3)},
            "session_wall": _elapsed(self.session_start)["wall"],
            "collection": self.collection,
            "tests": self.tests,
        }
        stem, suffix = os.path.splitext(self.path)
        parts = [stem] + (["jax"] if os.environ.get("KERAS_BACKEND") == "jax" else [])
        worker = os.environ.get("PYTEST_XDIST_WORKER")
        parts += [] if worker is None else [worker]
        path = self.path if len(parts) == 1 else ".".join(parts) + ".json"
        with open(path + ".partial", "w") as file:
            json.dump(record, file, indent=1)
        os.replace(path + ".partial", path)
        self.written = time.perf_counter()


def pytest_configure(config):
    path = os.environ.get(VARIABLE)
    if path and not config.pluginmanager.has_plugin("kgrad-cpu-times"):
        config.pluginmanager.register(CpuTimes(os.path.abspath(path)), "kgrad-cpu-times")


def phase_cpu_seconds(phases):
    """A test's CPU seconds: its own and its subprocesses', over setup, call and teardown.

    >>> phase_cpu_seconds({"setup": {"cpu": 1.0, "children_cpu": 2.0}, "call": {"cpu": 0.5, "children_cpu": 0}})
    3.5
    """
    return sum(phase["cpu"] + phase["children_cpu"] for phase in phases.values())


def ranking(records):
    """Tests and modules ranked by CPU seconds, over one or more runs' records.

    Returns ``(tests, modules, total)``: lists of ``(CPU seconds, name)``, most first,
    and the CPU seconds of the tests together.
    """
    tests = []
    modules = collections.Counter()
    for record in records:
        for nodeid, phases in record["tests"].items():
            seconds = phase_cpu_seconds(phases)
            tests.append((seconds, nodeid))
            modules[nodeid.split("::")[0]] += seconds
    tests.sort(reverse=True)
    return tests, sorted(((s, m) for m, s in modules.items()), reverse=True), sum(s for s, _ in tests)


def main(argv=None):
    parser = argparse.ArgumentParser(description="Rank the tests of KGRAD_TEST_CPU_TIMES files by CPU seconds.")
    parser.add_argument("files", nargs="+", help="JSON files written by a run with KGRAD_TEST_CPU_TIMES set")
    parser.add_argument("--top", type=int, default=20, help="how many tests and modules to list (default 20)")
    args = parser.parse_args(argv)
    records = []
    for name in args.files:
        with open(name) as file:
            records.append(json.load(file))
    tests, modules, total = ranking(records)
    process = sum(r["process"]["cpu"] + r["process"]["children_cpu"] for r in records)
    print(f"{len(tests)} tests: {total:.0f} CPU-s in tests, {process:.0f} CPU-s in the process(es) "
          f"(imports and collection included)")
    print(f"\ntop {args.top} tests, CPU-s (setup + call + teardown, subprocesses included):")
    for seconds, nodeid in tests[:args.top]:
        print(f"{seconds:8.1f}  {nodeid}")
    print(f"\ntop {args.top} modules, CPU-s:")
    for seconds, module in modules[:args.top]:
        print(f"{seconds:8.1f}  {module}")


if __name__ == "__main__":
    sys.exit(main())
