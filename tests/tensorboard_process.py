"""A real TensorBoard server on 127.0.0.1 for the tests: started, and always stopped."""

import contextlib
import re
import subprocess
import sys
import time

import pytest

#: TensorBoard prints this line to stderr once it listens ("TensorBoard 2.x at http://127.0.0.1:PORT/ ...").
SERVING = re.compile(r"TensorBoard \S+ at http://127\.0\.0\.1:(\d+)/")
#: How long a server may take to load its plugins and listen, on a loaded 2-core machine.
LISTEN_TIMEOUT_S = 180


def _listening_port(process, stderr_path):
    """The port the server says it listens on, once it says so; fails the test if it exits or never does."""
    deadline = time.monotonic() + LISTEN_TIMEOUT_S
    while True:
        serving = SERVING.search(stderr_path.read_text(errors="replace"))
        if serving:
            return int(serving.group(1))
        if process.poll() is not None:
            pytest.fail(f"tensorboard exited ({process.returncode}):\n{stderr_path.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"tensorboard did not listen in {LISTEN_TIMEOUT_S} s:\n{stderr_path.read_text()[-3000:]}")
        time.sleep(0.2)


@contextlib.contextmanager
def tensorboard_process(log_dir, stderr_path):
    """``(process, port)`` of ``tensorboard --logdir log_dir``, listening on 127.0.0.1.

    The operating system picks the port as the server binds it (``--port 0``):
    a port picked before the server starts can be taken by another test's
    server meanwhile (CI saw it). Its stderr goes to ``stderr_path`` (where
    the port is read, and for the failure messages of a test that waits for
    it); the process is terminated, then killed, when the block exits.
    """
    command = [sys.executable, "-m", "tensorboard.main", "--logdir", str(log_dir)]
    command += ["--host", "127.0.0.1", "--port", "0", "--reload_interval", "1"]
    with open(stderr_path, "w") as stderr:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        yield process, _listening_port(process, stderr_path)
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=20)
