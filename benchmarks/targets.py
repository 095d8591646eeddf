"""Issue 7's targets, judged against one model's results (pure functions)."""

from benchmarks import configs as configs_module
from benchmarks import timing


def cpu_ratio_of(result):
    """``(ratio, how)``: the median CPU ratio, or the too-slow estimate."""
    if result is None:
        return None, "not run"
    if result.get("cpu_ratio"):
        return result["cpu_ratio"]["median"], "measured"
    if result.get("estimated_cpu_ratio") is not None:
        return result["estimated_cpu_ratio"], "estimated: too slow to time"
    return None, result.get("note") or result.get("status", "not measured")


def _median_interval_of(result):
    """``(low, high)`` of the measured median CPU ratio, or ``None`` (estimated, or an older results.json)."""
    summary = result.get("cpu_ratio") or {}
    if "median_low" not in summary:
        return None
    return summary["median_low"], summary["median_high"]


def memory_ratio_of(results, name):
    """Peak RSS of ``name`` over its baseline's, or ``None``."""
    result = results.get(name) or {}
    base = results.get(result.get("baseline")) or {}
    own, ref = result.get("memory", {}).get("maxrss_mb"), base.get("memory", {}).get("maxrss_mb")
    return own / ref if own and ref else None


def _row(model, target, config, value, limit, how, noise=0.0, interval=None):
    if value is None:
        verdict = "not measured"
    else:
        verdict = "pass" if value <= limit else "FAIL"
    near = value is not None and abs(value - limit) <= noise
    return {
        "model": model,
        "target": target,
        "config": config,
        "value": value,
        "limit": limit,
        "how": how,
        "verdict": verdict,
        "within_noise": near,
        "interval": interval,
    }


def judge(model, results):
    """Every target that applies to one model's ``results``.

    Returns:
        A list of dicts: ``model``, ``target``, ``config``, ``value``,
        ``limit``, ``how``, ``verdict`` ("pass", "FAIL" or "not measured"),
        ``within_noise`` (the margin is inside the A/A noise floor) and
        ``interval`` (the median CPU ratio's 95% interval, or ``None``).
    """
    noise = timing.noise_floor((results.get(configs_module.AA_CONTROL) or {}).get("cpu_ratio"))
    rows = []
    for name, result in results.items():
        if result["status"] == "skipped":
            continue
        if result.get("time_target") is not None:
            value, how = cpu_ratio_of(result)
            rows.append(
                _row(model, "CPU time ratio", name, value, result["time_target"], how, noise,
                     _median_interval_of(result))
            )
        # No "memory" entry: not planned (--no-memory, or quick); no row.
        if result.get("memory_target") is not None and "memory" in result:
            value = memory_ratio_of(results, name)
            rows.append(_row(model, "peak memory ratio", name, value, result["memory_target"], "measured"))
    return rows + _judge_peers(model, results, noise)


def _judge_peers(model, results, noise):
    """kgrad's overhead as a fraction of the extra-pass peer's, at the same N."""
    rows = []
    for name, result in results.items():
        peer = configs_module.peer_of(name)
        if peer is None or peer not in results:
            continue
        ours, how = cpu_ratio_of(result)
        theirs, peer_how = cpu_ratio_of(results[peer])
        limit = configs_module.PEER_OVERHEAD_FRACTION
        target = f"overhead / {peer}'s"
        if ours is not None and theirs is not None and theirs - 1.0 <= noise:
            # No ratio of overheads when the peer's is noise; kgrad still
            # fails if its own overhead is clearly above the noise.
            clear = ours - 1.0 > noise
            how = f"kgrad's overhead {ours - 1.0:+.1%}; the peer's is within the noise floor"
            row = _row(model, target, name, None, limit, how)
            rows.append(dict(row, verdict="FAIL" if clear else "n/a"))
            continue
        value = None if ours is None or theirs is None else (ours - 1.0) / (theirs - 1.0)
        both = f"kgrad {how}, peer {peer_how}"
        rows.append(
            _row(
                model,
                target,
                name,
                value,
                limit,
                "measured" if both == "kgrad measured, peer measured" else both,
            )
        )
    return rows
