"""What the numbers were measured on: CPU, cores, load, library versions."""

import datetime
import os
import platform
import subprocess


def _cpu_model():
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gib():
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def _git(*args):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def load_average():
    """The 1-minute load average (``None`` where the OS does not say)."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def describe():
    """A dict describing this machine and the software measured."""
    import keras
    import numpy
    import tensorflow as tf

    import kgrad

    changed = _git("status", "--porcelain", "--", "kgrad")
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "cpu_model": _cpu_model(),
        "logical_cpus": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "memory_gib": _memory_gib(),
        "gpus": [device.name for device in tf.config.list_physical_devices("GPU")],
        "platform": platform.platform(),
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "numpy": numpy.__version__,
        "kgrad": getattr(kgrad, "__version__", "unknown"),
        "git_commit": _git("rev-parse", "--short", "HEAD"),
        "kgrad_uncommitted_changes": None if changed is None else bool(changed),
        "load_average_start": load_average(),
    }
