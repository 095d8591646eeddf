"""Running a script of tests/scripts in a process of its own and reading the JSON it prints.

The JAX tests with several simulated devices run their fits there: the number
of host devices is fixed when JAX starts (``XLA_FLAGS``).
"""

import json
import os
import subprocess
import sys

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts")


def run_script(name, **environment):
    """``(printed JSON, stderr)`` of ``python tests/scripts/<name>``, which must succeed.

    ``environment`` is added to this process's; TensorFlow's and XLA's start-up
    lines are silenced unless it says otherwise. The timeout (an hour) only keeps a
    hung process from hanging the suite, with room for a heavily loaded machine.
    """
    environment = dict(os.environ, **{"TF_CPP_MIN_LOG_LEVEL": "3", **environment})
    done = subprocess.run([sys.executable, os.path.join(SCRIPTS, name)], capture_output=True, text=True,
                          env=environment, timeout=3600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout), done.stderr
