"""tests/forked_python.py: each run is a fresh process, as `python` would start it."""

import pytest

from forked_python import PreloadedPython, cpu_seconds_of_forks


@pytest.fixture(scope="module")
def python(tmp_path_factory):
    server = PreloadedPython(tmp_path_factory.mktemp("server") / "stderr")
    yield server
    server.close()


def test_each_run_of_blocks_starts_fresh_and_names_the_failing_block(python, tmp_path):
    # As a process of its own would: no name, file or Keras setting of an earlier run is seen.
    first = [("a.md:1", "import keras\nx = 1\nopen('written', 'w').close()\nkeras.config.set_floatx('float16')")]
    assert python.run_blocks(first, tmp_path / "one") == (0, "", "")
    assert (tmp_path / "one" / "written").exists()
    second = [("a.md:7", "import os, keras\nprint(os.listdir('.'), keras.config.floatx())"), ("a.md:9", "x")]
    status, stdout, stderr = python.run_blocks(second, tmp_path / "two")
    assert (status, stdout) == (1, "[] float32\n")
    assert 'File "a.md:9", line 1' in stderr and "NameError: name 'x' is not defined" in stderr


def test_a_script_runs_as_main_with_its_arguments_and_its_exit_status(python, tmp_path):
    (tmp_path / "helper.py").write_text("VALUE = 'beside the script'\n")
    (tmp_path / "script.py").write_text(
        "import os, sys\nimport helper\n"
        "if __name__ == '__main__':\n"
        "    print(sys.argv[1:], helper.VALUE, os.getcwd() == sys.argv[1])\n"
        "    sys.exit(int(sys.argv[2]))\n"
    )
    folder = tmp_path / "work"
    assert python.run_script(tmp_path / "script.py", [folder, 0], folder) == (
        0, f"['{folder}', '0'] beside the script True\n", "")
    assert python.run_script(tmp_path / "script.py", [folder, 3], folder)[0] == 3


def test_a_forks_cpu_seconds_are_counted_when_it_ends(python, tmp_path):
    # tests/cpu_times.py charges them to the test that ran the fork, not to the server's end.
    before = cpu_seconds_of_forks()
    burn = "import time\nend = time.process_time() + 0.5\nwhile time.process_time() < end:\n    pass"
    assert python.run_blocks([("burn", burn)], tmp_path / "burn")[0] == 0
    assert 0.5 <= cpu_seconds_of_forks() - before < 5


def test_a_run_over_its_time_is_ended(tmp_path):
    server = PreloadedPython(tmp_path / "stderr")
    with pytest.raises(AssertionError, match="ran over 1 s"):
        server.run_blocks([("slow", "import time\ntime.sleep(600)")], tmp_path / "slow", timeout=1)
    assert server._server.poll() is not None  # the server and its fork were ended
