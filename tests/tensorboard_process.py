"""A real TensorBoard server on 127.0.0.1 for the tests: started, and always stopped."""

import contextlib
import socket
import subprocess
import sys


def free_loopback_port():
    """A port on 127.0.0.1 that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def tensorboard_process(log_dir, stderr_path):
    """``(process, port)`` of ``tensorboard --logdir log_dir`` on a free loopback port.

    Its stderr goes to ``stderr_path`` (for the failure messages of a test that
    waits for it); the process is terminated, then killed, when the block exits.
    """
    port = free_loopback_port()
    command = [sys.executable, "-m", "tensorboard.main", "--logdir", str(log_dir)]
    command += ["--host", "127.0.0.1", "--port", str(port), "--reload_interval", "1"]
    with open(stderr_path, "w") as stderr:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        yield process, port
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=20)
