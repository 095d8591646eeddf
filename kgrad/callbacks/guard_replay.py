"""What `kgrad.NonFiniteGuard` adds to a trip's report: the replay's fields, the latest finite summaries."""

from kgrad import backends
from kgrad.backends.common import batch_dump


def replay_fields(model, report, data, seeds_after):
    """The `kgrad.NonFiniteReport` fields of the replay of ``report``'s step on ``data``."""
    try:
        born, note = backends.current().replay_fields(model, data, seeds_after)
    except Exception as error:  # noqa: BLE001 - the sentinel's report stands
        return {"replayed": False,
                "replay_note": f"The replay failed ({type(error).__name__}: {error}); "
                               "the report is what the every-step check saw."}
    if born is None:
        return {"replayed": False, "replay_note": batch_dump.join_notes(
            f"The replay of step {report.step} was finite: it did not reproduce the trip (a "
            "random draw that is not from the model's seed generators, or a value that "
            "changed since?); the report is what the every-step check saw.", note)}
    if born["born_in"] == "weights":
        born["born_step"] = report.last_finite_step
    note = batch_dump.join_notes(born.get("replay_note"), note)
    return {**born, "replayed": True, "replay_note": note}


def latest_summaries(step, tape, layer, last_finite_step):
    """Summaries of ``layer`` (of ``tape``) from the latest probed step of ``step`` that was finite."""
    pipeline = step.pipelines().get(tape)
    state = None if pipeline is None else pipeline.state
    if state is None or last_finite_step is None:
        return {}
    records, _ = state.read_since(0)
    finite = [record for record in records if record.step <= last_finite_step]
    if not finite:
        return {}
    suffix = f"/{layer}"
    return {
        tag: value for tag, value in finite[-1].scalars.items() if tag.endswith(suffix)
    }
