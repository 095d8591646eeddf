"""Running a script of tests/scripts (or a benchmark) in a process of its own and reading its JSON.

The JAX tests with several simulated devices run their fits there: the number
of host devices is fixed when JAX starts (``XLA_FLAGS``).
"""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(ROOT, "tests", "scripts")


def run(command, **environment):
    """The finished process of ``command`` (a list), run from the repository root; it must succeed.

    ``environment`` is added to this process's; TensorFlow's and XLA's start-up
    lines are silenced unless it says otherwise. The timeout (an hour) only keeps a
    hung process from hanging the suite, with room for a heavily loaded machine.
    """
    environment = dict(os.environ, **{"TF_CPP_MIN_LOG_LEVEL": "3", **environment})
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=environment, timeout=3600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def run_script(name, **environment):
    """``(printed JSON, stderr)`` of ``python tests/scripts/<name>`` (`run`)."""
    done = run([sys.executable, os.path.join(SCRIPTS, name)], **environment)
    return json.loads(done.stdout), done.stderr
