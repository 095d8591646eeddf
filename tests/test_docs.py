"""Every ```python block of README.md and docs/*.md runs.

The blocks of one page run in order, in one fresh Python process (a fork of one that imported
Keras and kgrad, tests/forked_python.py), in a temporary folder,
so that a block may use what an earlier block of the same page defined (as a reader
does). A block that is not meant to run is preceded by a comment that says why::

    <!-- not run: a fragment of a GAN's train_step -->

(docs/development.md documents this for authors.)
"""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NOT_RUN = re.compile(r"^<!--\s*not run:\s*(?P<reason>\S.*?)\s*-->$")
FENCE = re.compile(r"^```(?P<language>[\w+-]*)\s*$")
# Pages whose blocks take more than ~20 s together on 2 CPU cores.
SLOW_PAGES = set()  # none today: every page runs in 4-13 s

@pytest.fixture
def run_blocks(preloaded_python):
    """``run(blocks, folder) -> (exit status, stdout, stderr)``: ``blocks`` as ``[(name, source)]``.

    Each run is a fresh process (a fork of one that imported Keras and kgrad:
    tests/forked_python.py), so a block sees nothing another page's or block's run
    defined, wrote or set; a traceback names the page and line ("docs/fit.md:12").
    """
    return preloaded_python.run_blocks


def _relative(page):
    return page.relative_to(ROOT).as_posix()


def code_blocks(page):
    """``[(line, language, source, not_run_reason)]`` of the fenced blocks of a Markdown page.

    ``line`` is the 1-based line of the block's first line of code; ``not_run_reason``
    the reason of a ``<!-- not run: reason -->`` comment on the line before the fence
    (blank lines between them allowed), else ``None``.
    """
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks, index = [], 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if not opening:
            index += 1
            continue
        before = [line for line in lines[:index] if line.strip()]
        marker = NOT_RUN.match(before[-1].strip()) if before else None
        end = index + 1
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        source = "\n".join(lines[index + 1 : end]) + "\n"
        blocks.append((index + 2, opening["language"], source, marker and marker["reason"]))
        index = end + 1
    return blocks


def _page_param(page):
    name = _relative(page)
    marks = [pytest.mark.slow] if name in SLOW_PAGES else []
    return pytest.param(page, id=name, marks=marks)


RUNNABLE_PAGES = [
    _page_param(page)
    for page in PAGES
    if any(language == "python" and not reason for _, language, _, reason in code_blocks(page))
]


def _run_page(run_blocks, page, work):
    """Runs the page's python blocks in folder ``work``; returns their stdout."""
    blocks = [
        (f"{_relative(page)}:{line}", source)
        for line, language, source, reason in code_blocks(page)
        if language == "python" and not reason
    ]
    status, stdout, stderr = run_blocks(blocks, work)
    assert status == 0, f"a ```python block of {_relative(page)} failed:\n{stderr[-4000:]}"
    return stdout


@pytest.mark.parametrize("page", RUNNABLE_PAGES)
def test_python_blocks_of_the_page_run(run_blocks, page, tmp_path):
    _run_page(run_blocks, page, tmp_path / "cwd")


# Each python block but a page's first (which the test above runs first, in a fresh folder).
LATER_BLOCKS = [
    pytest.param(page, line, id=f"{_relative(page)}:{line}", marks=[pytest.mark.slow])
    for page in PAGES
    for line, _, _, _ in [block for block in code_blocks(page) if block[1] == "python" and not block[3]][1:]
]


# A block that reads what the page's first block writes (a NonFiniteGuard's dump) says so.
AFTER_FIRST = re.compile(r"^<!--\s*runs after the page's first block:\s*\S.*-->$")


def _runs_after_first(page, line):
    """Whether the comment before the block at ``line`` (its first line of code) is an `AFTER_FIRST` marker."""
    before = [text for text in page.read_text(encoding="utf-8").splitlines()[: line - 2] if text.strip()]
    return bool(before) and bool(AFTER_FIRST.match(before[-1].strip()))


@pytest.mark.parametrize("page, line", LATER_BLOCKS)
def test_each_block_runs_on_its_own_in_a_fresh_folder(run_blocks, page, line, tmp_path):
    # A reader may copy one block: it must not need what an earlier block defined or wrote,
    # unless it says it runs after the page's first block (which then runs before it).
    blocks = [(first, source) for first, language, source, reason in code_blocks(page)
              if language == "python" and not reason]
    chosen = [block for block in blocks if block[0] == line]
    if _runs_after_first(page, line):
        chosen = [blocks[0]] + chosen
    status, _, stderr = run_blocks([(f"{_relative(page)}:{first}", source) for first, source in chosen],
                                   tmp_path / "cwd")
    assert status == 0, f"{_relative(page)}:{line} failed on its own:\n{stderr[-4000:]}"


def test_the_readmes_examples_run_twice_in_one_folder_without_mixing(run_blocks, tmp_path):
    # A second run writes into the folders of the first: each prints what it printed alone
    # (README example 1: the first probed steps [0 8 16], not a mix of two fits' steps).
    first = _run_page(run_blocks, ROOT / "README.md", tmp_path / "cwd")
    second = _run_page(run_blocks, ROOT / "README.md", tmp_path / "cwd")
    assert "[ 0  8 16]" in first
    assert second.splitlines()[:2] == first.splitlines()[:2]
    import kgrad

    logs = kgrad.read_logs(str(tmp_path / "cwd" / "logs" / "run1"))
    assert logs["kgrad"]["scalars"]["weight_grad_norm/hidden/kernel"].steps.tolist() == [0, 8, 16, 24]


def test_every_probe_of_the_docs_that_writes_a_fixed_folder_is_safe_to_run_twice():
    # A log_dir that holds an earlier fit's logs is refused unless overwrite=True.
    for page in PAGES:
        for line, language, source, reason in code_blocks(page):
            if language != "python" or reason:
                continue
            for call in _calls("GradientProbe", source):
                if re.match(r"GradientProbe\(\s*[\"']", call):  # a fixed folder
                    assert "overwrite=True" in call, f"{_relative(page)}:{line}: {call}"


def _calls(name, source):
    """The text of each call ``name(...)`` in ``source``, up to its matching parenthesis."""
    calls = []
    for start in (match.start() for match in re.finditer(rf"\b{name}\(", source)):
        depth, end = 0, start + len(name)
        for end in range(start + len(name), len(source)):
            depth += {"(": 1, ")": -1}.get(source[end], 0)
            if depth == 0:
                break
        calls.append(source[start:end + 1])
    return calls


def test_every_page_with_python_has_its_blocks_run():
    runnable = {param.id for param in RUNNABLE_PAGES}
    assert "README.md" in runnable
    for page in PAGES:
        blocks = code_blocks(page)
        if any(language == "python" and not reason for _, language, _, reason in blocks):
            assert _relative(page) in runnable


def test_not_run_markers_are_few_and_each_stands_before_a_python_block():
    markers = {}
    for page in PAGES:
        lines = page.read_text(encoding="utf-8").splitlines()
        marked = [number for number, line in enumerate(lines, 1) if NOT_RUN.match(line.strip())]
        skipped = [line for line, language, _, reason in code_blocks(page) if reason]
        assert all(language == "python" for _, language, _, reason in code_blocks(page) if reason), page
        # Each marker is followed by the block it skips (nothing but blank lines between).
        assert len(marked) == len(skipped), f"{_relative(page)}: a not-run marker before no block"
        if marked:
            markers[_relative(page)] = marked
    assert sum(len(lines) for lines in markers.values()) <= 5, markers


def test_code_blocks_finds_blocks_lines_and_markers(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "text\n```python\nx = 1\n```\n\n<!-- not run: a fragment -->\n\n```python\n...\n```\n"
        "```bash\nls\n```\n```\nplain output\n```\n"
    )
    assert code_blocks(page) == [
        (3, "python", "x = 1\n", None),
        (9, "python", "...\n", "a fragment"),
        (12, "bash", "ls\n", None),
        (15, "", "plain output\n", None),
    ]
