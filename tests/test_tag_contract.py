"""The tag contract (`kgrad.plan.tag_names`): docs/tags.md lists exactly its tags, each has a
description, and every tag the report and the tab read is one of them."""

import itertools
import pathlib
import re

import pytest

from kgrad.plan.tag_names import GLOBAL_PREFIX, MOMENT_NAMES, TENSOR_KINDS, describe_tag, tag_prefixes

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _expand(pattern):
    """The tags of a docs pattern: ``<stat>``, ``<kind>`` and ``{a,b}`` expanded; a name placeholder cut."""
    choices = {"<stat>": MOMENT_NAMES, "<kind>": tuple(TENSOR_KINDS)}
    parts = re.split(r"(<stat>|<kind>|\{[^}]*\})", pattern.split("/<")[0])
    options = [
        choices[part] if part in choices else part[1:-1].split(",") if part.startswith("{") else [part]
        for part in parts
    ]
    suffix = "/" if "/<" in pattern else ""
    return {"".join(chosen) + suffix for chosen in itertools.product(*options)}


def _documented_tags():
    text = (ROOT / "docs" / "tags.md").read_text()
    section = text.split("\n## TensorBoard tags\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    assert rows, "docs/tags.md has no table of tags under '## TensorBoard tags'"
    patterns = [pattern for row in rows for pattern in re.findall(r"`([^`]+)`", row.split(" | ")[0])]
    return set().union(*(_expand(pattern) for pattern in patterns))


def test_docs_tags_md_lists_exactly_the_tags_of_the_contract():
    documented, contract = _documented_tags(), set(tag_prefixes())
    assert documented - contract == set(), "in docs/tags.md, not in kgrad/plan/tag_names.py"
    assert contract - documented == set(), "in kgrad/plan/tag_names.py, not in docs/tags.md"


def test_expanding_a_docs_pattern():
    assert _expand("logit_{max,lse}_{mean,max}/<output>") == {
        "logit_max_mean/", "logit_max_max/", "logit_lse_mean/", "logit_lse_max/"}
    assert _expand("global/loss") == {"global/loss"}
    assert _expand("<kind>_hist/<name>") == {f"{kind}_hist/" for kind in TENSOR_KINDS}


@pytest.mark.parametrize("prefix", tag_prefixes())
def test_every_tag_of_the_contract_has_its_own_description(prefix):
    tag = prefix + "dense/kernel" if prefix.endswith("/") else prefix
    description = describe_tag(tag)
    if prefix.startswith("guard/"):
        return  # a text summary: TensorBoard's Text tab, no tooltip
    assert description.startswith("kgrad: ") and len(description) > len("kgrad: ") + 10
    if prefix.endswith("/"):
        assert "`dense/kernel`" in description  # names what it is of


def _tag_literals(path):
    """Tag-shaped string literals of a source file: ``"<prefix>/"``, ``"global/<tag>"``, ``"guard/<tag>"``."""
    source = path.read_text()
    quote = r"[\"'`]"
    per_name = re.findall(quote + r"([a-z][a-z0-9]*_[a-z0-9_]+/)(?=[\"'`{$])", source)
    whole = re.findall(quote + r"((?:global|guard)/[a-z_]*)" + quote, source)
    return set(per_name) | set(whole)


READERS = sorted(
    path.relative_to(ROOT).as_posix()
    for folder in ("kgrad/report", "kgrad/dashboard", "kgrad/logs", "kgrad/callbacks")
    for path in (ROOT / folder).rglob("*")
    if path.suffix in (".py", ".js")
)


@pytest.mark.parametrize("reader", READERS)
def test_every_tag_the_report_and_the_tab_read_is_in_the_contract(reader):
    assert _tag_literals(ROOT / reader) - {*tag_prefixes(), GLOBAL_PREFIX} == set()


def test_the_readers_are_checked():
    # The check above sees what the tab and the report read (it cannot pass by finding nothing).
    seen = set().union(*(_tag_literals(ROOT / reader) for reader in READERS))
    assert {"grad_norm/", "weight_grad_norm/", "adam_rms/", "global/loss", "weight_grad_hist/"} <= seen
