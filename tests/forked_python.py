"""Fresh Python processes at a fraction of the cost: forks of one that imported Keras and kgrad.

A test that runs a script or a page's code blocks wants a fresh process (nothing
another test defined, wrote or set), but a fresh process spends ~6 CPU-s importing
TensorFlow before it runs a line. ``PreloadedPython`` starts one server process that
imports numpy, Keras (and with it the backend) and kgrad, then forks it for each
run: each fork is a fresh process that has run those imports, and nothing else.
Keras picks its backend once per process, so the server runs on the backend of the
test run (``KERAS_BACKEND`` is passed on).

Example::

    python = PreloadedPython(tmp_path / "server.stderr")
    status, stdout, stderr = python.run_script("examples/noise_scale.py", ["logs"], tmp_path)
    python.close()
"""

import json
import os
import select
import signal
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The forks' CPU seconds, for tests/cpu_times.py: a fork is the server's child, so the test
# run's RUSAGE_CHILDREN sees it only when the server ends, at the end of the session.
_forks = {"ended": 0.0, "counted_with_their_server": 0.0}


def cpu_seconds_of_forks():
    """CPU seconds of the forks that ended, less those of servers that ended (counted as children then)."""
    return _forks["ended"] - _forks["counted_with_their_server"]

# Each request is one JSON line on stdin: [kind, what, arguments, folder, stdout file, stderr file].
# kind "blocks": `what` is a JSON file of [[name, source], ...], run in order in one namespace
# (a traceback names each block's `name`, e.g. "docs/fit.md:12"); kind "script": `what` is a
# script's path, run as __main__ with sys.argv = [what, *arguments]. The answer, one line on
# stdout, is the fork's exit status (1 and a traceback on stderr for an exception, as `python`)
# and its CPU seconds.
SERVER = """
import gc, json, os, runpy, sys
import numpy, keras, kgrad  # keras imports its backend
# The imports' objects live as long as a process does: out of the collector's sight, a fork's
# exit need not touch (and copy) their pages: 0.3 CPU-s, not 1.5 (a fresh process: 6.4).
gc.freeze()
for request in sys.stdin:
    kind, what, arguments, folder, stdout, stderr = json.loads(request)
    pid = os.fork()
    if pid == 0:
        os.chdir(folder)
        written = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, stdout, written), (2, stderr, written)):
            os.dup2(os.open(path, flags), fd)
        if kind == "script":
            sys.argv = [what, *arguments]
            sys.path[0] = os.path.dirname(os.path.abspath(what))
            runpy.run_path(what, run_name="__main__")
        else:
            namespace = {"__name__": "__main__"}
            for name, source in json.load(open(what)):
                exec(compile(source, name, "exec"), namespace)
        sys.exit(0)
    _, status, usage = os.wait4(pid, 0)
    print(os.waitstatus_to_exitcode(status), usage.ru_utime + usage.ru_stime, flush=True)
"""


class PreloadedPython:
    """A server process that forks a fresh, preloaded Python process for each run.

    Args:
        stderr_path: where the server's own stderr goes (shown if it ends early).
        env: extra environment variables for the server and its forks.
    """

    def __init__(self, stderr_path, env=None):
        environment = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **(env or {})}
        environment["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, environment.get("PYTHONPATH")]))
        self._stderr_path = str(stderr_path)
        self._forks_cpu = 0.0
        with open(self._stderr_path, "w") as stderr:
            # A session of its own: a run over its time is ended with the server (`close`).
            self._server = subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE,
                                            stdout=subprocess.PIPE, stderr=stderr, env=environment, text=True,
                                            start_new_session=True)

    def run_blocks(self, blocks, folder, timeout=600):
        """Runs ``blocks`` (``[(name, source)]``) in one namespace in ``folder``: (status, stdout, stderr)."""
        folder = os.fspath(folder)
        os.makedirs(folder, exist_ok=True)
        with open(folder + ".blocks.json", "w") as file:
            json.dump(blocks, file)
        return self._run("blocks", folder + ".blocks.json", [], folder, timeout)

    def run_script(self, script, arguments, folder, timeout=600):
        """Runs ``script`` with ``arguments`` (strings) in ``folder``: (status, stdout, stderr)."""
        folder = os.fspath(folder)
        os.makedirs(folder, exist_ok=True)
        return self._run("script", os.path.abspath(script), [str(a) for a in arguments], folder, timeout)

    def _run(self, kind, what, arguments, folder, timeout):
        out, err = folder + ".stdout", folder + ".stderr"
        self._server.stdin.write(json.dumps([kind, what, arguments, folder, out, err]) + "\n")
        self._server.stdin.flush()
        ready, _, _ = select.select([self._server.stdout], [], [], timeout)
        if not ready:
            self.close(kill=True)
            raise AssertionError(f"{what} ran over {timeout} s")
        answer = self._server.stdout.readline()
        if not answer:
            with open(self._stderr_path) as stderr:
                raise AssertionError(f"the preloaded Python ended:\n{stderr.read()[-4000:]}")
        status, cpu = answer.split()
        self._forks_cpu += float(cpu)
        _forks["ended"] += float(cpu)
        with open(out) as stdout, open(err) as stderr:
            return int(status), stdout.read(), stderr.read()

    def close(self, kill=False):
        """Ends the server; with ``kill``, at once, with the run in progress."""
        if kill:
            os.killpg(self._server.pid, signal.SIGKILL)
        self._server.stdin.close()
        self._server.wait(timeout=60)
        _forks["counted_with_their_server"] += self._forks_cpu
        self._forks_cpu = 0.0
