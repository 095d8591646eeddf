"""kgrad.report.spike_leaders: the tie rule and the rounding-noise rule, on tiny hand-made values."""

import math

import pytest

from kgrad.report import spike_rules
from kgrad.report.spike_leaders import rank_skip_leaders
from kgrad.report.spike_rules import ROUNDING_NOISE_RATIO, rounding_noise, tied_by_size


def _attention_values():
    """One skipped step of an attention block: the key bias's gradient is float32 rounding."""
    values = {
        "grad_norm": {"mha/query/kernel": 0.8, "mha/query/bias": 0.02, "mha/key/kernel": 0.6,
                      "mha/key/bias": 4e-10, "dense/kernel": 0.3, "dense/bias": 0.05},
        "update_ratio": {"mha/query/kernel": 0.2, "mha/key/kernel": 0.1, "mha/key/bias": 0.4,
                         "dense/kernel": 0.01},
        "adam_rms": {"mha/key/bias": 0.004, "mha/query/kernel": 3.0},
    }
    z_scores = {
        "grad_norm": {"mha/query/kernel": 30.0, "mha/query/bias": 2.0, "mha/key/kernel": 9.0,
                      "mha/key/bias": 500.0, "dense/kernel": 1.0, "dense/bias": -0.5},
        "update_ratio": {"mha/query/kernel": 28.0, "mha/key/kernel": 8.5, "mha/key/bias": 400.0,
                         "dense/kernel": -0.2},
        "adam_rms": {"mha/key/bias": 900.0, "mha/query/kernel": 12.0},
    }
    return values, z_scores


def test_groups_are_ranked_by_size_and_sizes_within_ten_percent_tie():
    leaders = rank_skip_leaders(*_attention_values())
    sizes = [[(entry.weight, entry.value_name) for entry in group] for group in leaders.groups]
    assert sizes[0] == [("mha/query/kernel", "grad_norm"), ("mha/query/kernel", "update_ratio")]  # 30, 28
    assert sizes[1] == [("mha/query/kernel", "adam_rms")]
    assert sizes[2] == [("mha/key/kernel", "grad_norm"), ("mha/key/kernel", "update_ratio")]  # 9, 8.5
    flat = [abs(entry.z) for group in leaders.groups for entry in group]
    assert flat == sorted(flat, reverse=True)
    entry = leaders.groups[0][0]
    assert entry == ("mha/query", "mha/query/kernel", "grad_norm", 30.0, 0.8)
    assert entry.layer == "mha/query" and entry.value == 0.8


def test_a_key_bias_at_rounding_level_is_never_scored_and_the_report_says_why():
    leaders = rank_skip_leaders(*_attention_values())
    weights = {entry.weight for group in leaders.groups for entry in group}
    assert "mha/key/bias" not in weights  # its z-scores (500, 400, 900) are the largest
    reasons = dict(leaders.not_scored)
    assert "rounding noise" in reasons["mha/key/bias"] and "mha/key/kernel" in reasons["mha/key/bias"]
    words = leaders.describe()
    moved, not_scored = words.split("\n")
    assert "mha/key/bias" not in moved and "mha/query" in moved
    assert not_scored.startswith("not scored: mha/key/bias (rounding noise")


def test_describe_names_the_largest_layer_first_and_says_a_tie_as_a_tie():
    values = {"grad_norm": {"a/kernel": 1.0, "b/kernel": 1.0, "c/kernel": 1.0}}
    z_scores = {"grad_norm": {"a/kernel": 20.0, "b/kernel": 41.0, "c/kernel": 40.6}}
    words = rank_skip_leaders(values, z_scores).describe()
    assert "2 tied: b (grad_norm of kernel z 41, 1), c (grad_norm of kernel z 40.6, 1); a (" in words
    # Each layer once, at its largest value.
    z_scores["update_ratio"] = {"a/kernel": 45.0}
    values["update_ratio"] = {"a/kernel": 0.5}
    layers = rank_skip_leaders(values, z_scores).layers()
    assert [[entry.layer for entry in group] for group in layers] == [["a", "b", "c"]]  # 45, 41, 40.6
    assert rank_skip_leaders(values, z_scores).describe().startswith(
        "moved most (above 6σ of their history), largest first: 3 tied: a (update_ratio")


def test_nothing_above_the_rule_is_said_as_such():
    words = rank_skip_leaders({"grad_norm": {"a/kernel": 1.0}}, {"grad_norm": {"a/kernel": -2.5}}).describe()
    assert words == "no layer's value was above 6σ of its history; the largest: a (grad_norm of kernel z -2.5, 1)"


def test_weights_without_history_are_listed_not_ranked():
    values = {"grad_norm": {"a/kernel": 1.0, "b/kernel": 2.0}, "update_ratio": {"b/kernel": 0.1}}
    leaders = rank_skip_leaders(values, {"grad_norm": {"a/kernel": 7.0}, "update_ratio": {"b/kernel": math.nan}})
    assert [entry.weight for group in leaders.groups for entry in group] == ["a/kernel"]
    assert leaders.not_scored == (("b/kernel", "no z-score: not enough history of its values yet"),)
    assert rank_skip_leaders({}, {}).describe() == "no value could be scored"


def test_the_result_is_frozen():
    leaders = rank_skip_leaders(*_attention_values())
    with pytest.raises(AttributeError):
        leaders.groups = ()
    assert isinstance(leaders.groups, tuple) and all(isinstance(group, tuple) for group in leaders.groups)


@pytest.mark.parametrize("argument", ["values", "z_scores"])
def test_bad_input_names_the_argument(argument):
    good = {"grad_norm": {"a/kernel": 1.0}}
    for bad, expected in (([1.0], "must be a dict"), ({"grad_nrom": {}}, "unknown value names ['grad_nrom']")):
        tables = {"values": good, "z_scores": good, argument: bad}
        with pytest.raises(ValueError, match=f"`{argument}`") as error:
            rank_skip_leaders(tables["values"], tables["z_scores"])
        assert expected in str(error.value)


def test_rounding_noise_is_relative_to_the_same_layer_only():
    threshold = ROUNDING_NOISE_RATIO * 0.5
    norms = {"a/kernel": 0.5, "a/bias": threshold * 0.99, "b/bias": threshold * 1.01, "b/kernel": 0.5,
             "c/bias": 1e-12, "d/kernel": 0.0, "e/kernel": math.inf, "e/bias": 1e-30}
    found = dict(rounding_noise(norms))
    assert set(found) == {"a/bias", "d/kernel"}  # c/bias: alone in its layer; e/kernel: a blow-up
    assert found["d/kernel"] == "its gradient norm is exactly 0"
    # Beside an infinite norm there is no finite scale to be rounding noise of.
    assert "e/bias" not in found


def test_tied_by_size_keeps_infinities_together_and_equal_sizes_in_order():
    groups = tied_by_size(["x", "y", "z", "w"], {"x": 5.0, "y": math.inf, "z": 5.0, "w": math.inf}.get)
    assert groups == [["y", "w"], ["x", "z"]]
    # The tolerance is relative to the group's largest: 100, 91 tie; 89 starts a new group.
    assert tied_by_size([100.0, 91.0, 89.0], float) == [[100.0, 91.0], [89.0]]
    assert spike_rules.TIE_TOLERANCE == 0.1
