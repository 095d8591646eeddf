"""Benchmarking one model: warm-ups, interleaved timed pairs, ratios.

For one model, every configuration gets a fresh model with the same initial
weights, its own ``fit`` thread (see `benchmarks.interleave`) and the same
data. Then:

1. Warm-up turn per configuration: tracing and ``warmup_epochs`` epochs,
   whose steps after the first two (`benchmarks.interleave.SETUP_STEPS`)
   size the samples. A warm-up whose steady steps run past ``max_warmup_cpu``
   is stopped: the configuration is
   reported "too slow", with a ratio estimated from those steps. Once all
   are traced, one more untimed epoch each (`ModelBench._settle`).
2. Timed rounds: configurations in triplets around a baseline sample (see
   `benchmarks.timing.round_triplets`); each sample is ``k`` whole epochs,
   ``k`` chosen so the baseline's sample lasts ``sample_cpu`` CPU-seconds.
3. Per configuration, the median of the per-pair CPU-time ratios, with the
   wall-time ratio beside it.
"""

import dataclasses
import gc
import os

from benchmarks import configs as configs_module
from benchmarks import timing
from benchmarks.interleave import SETUP_STEPS, ConfigRunner
from benchmarks.models import build_model, first_batch, make_data, make_dataset


@dataclasses.dataclass(frozen=True)
class Settings:
    """How long and how often to measure (see `benchmarks.run` for presets)."""

    steps_per_epoch: int
    warmup_epochs: int
    sample_cpu: float
    pairs: int
    min_pairs: int
    config_budget: float
    max_warmup_cpu: float
    seed: int = 0
    distinct_batches: int = 50
    #: Steps of a sample, ending mid-epoch (`ConfigRunner.run_steps`); ``None``:
    #: samples of whole epochs, as many as ``sample_cpu`` asks for.
    sample_steps: int = None


def make_inputs(spec, settings):
    """``(x, y, dataset)``: one model's data, shared by all its configurations."""
    x, y = make_data(spec, min(settings.distinct_batches, settings.steps_per_epoch), settings.seed)
    return x, y, make_dataset(spec, x, y)


def prepare(spec, config, settings, inputs, log_dir):
    """The compiled model and the callbacks of one configuration."""
    x, y, _ = inputs
    model = build_model(spec, settings.seed, config.jit_compile)
    x_batch, y_batch = first_batch(spec, x, y)
    return model, config.make_callbacks(log_dir, x_batch, y_batch)


def _describe_error(error):
    return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"


class ModelBench:
    """Runs every configuration of one model and returns their results.

    Args:
        spec: A `benchmarks.models.ModelSpec`.
        configs: The `benchmarks.configs.Config`s, baselines included.
        settings: `Settings`.
        log_root: Folder for the configurations' TensorBoard logs.
        say: ``fn(text)`` for progress lines.
    """

    def __init__(self, spec, configs, settings, log_root, say=print):
        self.spec = spec
        self.configs = {config.name: config for config in configs}
        self.settings = settings
        self.log_root = log_root
        self.say = say
        self.runners = {}
        self.results = {name: _empty_result(config) for name, config in self.configs.items()}
        self.epochs_per_sample = 1
        self.inputs = make_inputs(spec, settings)

    def run(self):
        """Measures every configuration; returns ``{name: result dict}``."""
        try:
            for config in self.configs.values():
                self._warm_up(config)
            base = self.results[configs_module.BASELINE]
            if base["status"] != "ok":
                raise RuntimeError(f"The baseline of {self.spec.name} failed: {base['note']}")
            if self.settings.sample_steps is None:
                self.epochs_per_sample = timing.epochs_per_sample(
                    base["calibration_epoch_cpu"], self.settings.sample_cpu
                )
            self._plan_pairs()
            self._settle()
            # Tracing leaves large object graphs behind; without this, the
            # collector's next full pass lands in whichever sample comes first.
            gc.collect()
            gc.freeze()
            self._timed_rounds()
        finally:
            for runner in self.runners.values():
                runner.finish()
            gc.unfreeze()
        self._summarize()
        return self.results

    def _say(self, text):
        self.say(f"[{self.spec.name}] {text}")

    def _warm_up(self, config):
        result = self.results[config.name]
        reason = configs_module.unavailable_reason(config)
        if reason:
            result.update(status="skipped", note=reason)
            self._say(f"skip {config.name}: {reason}")
            return
        log_dir = os.path.join(self.log_root, self.spec.name, config.name)
        try:
            model, callbacks = prepare(self.spec, config, self.settings, self.inputs, log_dir)
        except Exception as error:  # a broken config must not stop the others
            result.update(status="error", note=_describe_error(error))
            self._say(f"error building {config.name}: {result['note']}")
            return
        dataset = self.inputs[2]
        runner = ConfigRunner(config.name, model, dataset, self.settings.steps_per_epoch, callbacks)
        self.runners[config.name] = runner
        sample = runner.start(self.settings.warmup_epochs, self.settings.max_warmup_cpu)
        self._record_warm_up(config, runner, sample)

    def _record_warm_up(self, config, runner, sample):
        result = self.results[config.name]
        if runner.error is not None:
            result.update(status="error", note=_describe_error(runner.error))
            self._say(f"error in {config.name}: {result['note']}")
            return
        result["warmup"] = dataclasses.asdict(sample)
        if not runner.step_stamps:
            result.update(status="error", note="the warm-up ran no step")
            return
        # Setup, tracing (and XLA compilation) and the first step: what every
        # `fit` call with this configuration pays before training.
        result["first_step_cpu"] = runner.step_stamps[0] - runner.started_cpu
        steady = runner.step_stamps[SETUP_STEPS - 1 :]
        per_step, whole = timing.steady_step_cpu(steady, config.every_n_steps)
        result["calibration_epoch_cpu"] = per_step * self.settings.steps_per_epoch if per_step else None
        if runner.aborted:
            self._record_too_slow(config, per_step, whole, len(runner.step_stamps))
            return
        self._say(
            f"warm-up {config.name}: first step {result['first_step_cpu']:.1f} CPU-s, then "
            f"{result['calibration_epoch_cpu']:.2f} CPU-s per epoch of {self.settings.steps_per_epoch} steps"
        )

    def _record_too_slow(self, config, per_step, whole, steps):
        result = self.results[config.name]
        base_epoch = self.results.get(config.baseline, {}).get("calibration_epoch_cpu")
        estimate = None
        if per_step is not None and base_epoch:
            estimate = per_step / (base_epoch / self.settings.steps_per_epoch)
        shown = "unknown" if estimate is None else f"{'' if whole else 'at least '}{estimate:.2f}"
        result.update(
            status="too_slow",
            estimated_cpu_ratio=estimate,
            estimate_is_lower_bound=not whole,
            note=(
                f"too slow to time: {steps} warm-up steps passed {self.settings.max_warmup_cpu:.0f} "
                f"CPU-s after the first {SETUP_STEPS}; CPU ratio estimated from them: {shown}"
            ),
        )
        self._say(f"{config.name}: {result['note']}")

    def _settle(self):
        """One untimed epoch per configuration once all are traced.

        The first call of a traced step after other configurations added
        their functions to TensorFlow's runtime costs more (measured: ~80 ms
        for the MLP, in its first sample only); this pays it outside the
        timed samples.
        """
        for name in [configs_module.BASELINE, configs_module.BASELINE_XLA, *self._timed_configs()]:
            if name in self.runners and self.results[name]["status"] == "ok":
                self._sample(name, 1)

    def _timed_configs(self):
        return [
            name
            for name, config in self.configs.items()
            if name not in (configs_module.BASELINE, configs_module.BASELINE_XLA)
            and self.results[name]["status"] == "ok"
            and self.results.get(config.baseline, {}).get("status") == "ok"
        ]

    @property
    def steps_per_sample(self):
        """Steps of one timed sample."""
        if self.settings.sample_steps is not None:
            return self.settings.sample_steps
        return self.epochs_per_sample * self.settings.steps_per_epoch

    def _plan_pairs(self):
        k, settings = self.steps_per_sample / self.settings.steps_per_epoch, self.settings
        for name in self._timed_configs():
            config = self.configs[name]
            own = k * (self.results[name]["calibration_epoch_cpu"] or 0.0)
            base = k * (self.results[config.baseline]["calibration_epoch_cpu"] or 0.0)
            # The budget is for ratios far above the noise. Where the verdict
            # is within the noise (a target close to the calibration ratio)
            # or the noise is the point (A/A), fewer pairs would decide it
            # by chance: 5 pairs of the XLA CNN at N=100 had an IQR of
            # 0.95-1.08 around a 1.03 target.
            every_pair = name == configs_module.AA_CONTROL or timing.near_target(
                config.time_target, own, base
            )
            budget = None if every_pair else settings.config_budget
            self.results[name]["pairs_planned"] = timing.pairs_within_budget(
                settings.pairs, settings.min_pairs, own, base, budget
            )

    def _timed_rounds(self):
        k = self.epochs_per_sample
        rounds = max([self.results[n]["pairs_planned"] for n in self._timed_configs()] or [0])
        shape = (
            f"{k} epoch(s) x {self.settings.steps_per_epoch} steps"
            if self.settings.sample_steps is None else f"{self.settings.sample_steps} steps"
        )
        self._say(f"timing: {rounds} rounds, samples of {shape}")
        for round_index in range(rounds):
            for baseline in (configs_module.BASELINE, configs_module.BASELINE_XLA):
                members = [
                    name
                    for name in self._timed_configs()
                    if self.configs[name].baseline == baseline
                    and self.results[name]["pairs_planned"] > round_index
                ]
                for before, after in timing.round_triplets(members, round_index):
                    self._run_triplet(round_index, baseline, before, after)
            self._say(f"round {round_index + 1}/{rounds} done")

    def _run_triplet(self, round_index, baseline, before, after):
        k = self.epochs_per_sample
        first = self._sample(before, k)
        base = self._sample(baseline, k)
        if base is None:
            raise RuntimeError(f"Baseline {baseline} failed: {self.results[baseline]['note']}")
        self.results[baseline]["samples"].append(dataclasses.asdict(base))
        second = self._sample(after, k)
        for name, sample, order in ((before, first, "config_first"), (after, second, "baseline_first")):
            if name is not None and sample is not None:
                self.results[name]["pairs"].append(
                    {
                        "round": round_index,
                        "order": order,
                        "cpu": sample.cpu,
                        "wall": sample.wall,
                        "baseline_cpu": base.cpu,
                        "baseline_wall": base.wall,
                    }
                )

    def _sample(self, name, epochs):
        """A timed turn of ``name``: ``epochs`` epochs, or one sample of `Settings.sample_steps`."""
        if name is None:
            return None
        runner = self.runners[name]
        if self.settings.sample_steps is None:
            sample = runner.run(epochs)
        else:
            sample = runner.run_steps(self.settings.sample_steps)
        if sample is None and self.results[name]["status"] == "ok":
            self.results[name].update(status="error", note=_describe_error(runner.error))
            self._say(f"error in {name}: {self.results[name]['note']}")
        return sample

    def _summarize(self):
        steps = self.steps_per_sample
        for result in self.results.values():
            pairs = result["pairs"]
            result["cpu_ratio"] = timing.ratio_summary([p["cpu"] / p["baseline_cpu"] for p in pairs])
            result["wall_ratio"] = timing.ratio_summary([p["wall"] / p["baseline_wall"] for p in pairs])
            own = [p["cpu"] for p in pairs] or [s["cpu"] for s in result["samples"]]
            if own:
                result["cpu_ms_per_step"] = 1000 * timing.ratio_summary(own)["median"] / steps
            elif result.get("calibration_epoch_cpu"):
                epoch = result["calibration_epoch_cpu"]
                result["cpu_ms_per_step"] = 1000 * epoch / self.settings.steps_per_epoch


def _empty_result(config):
    return {
        "name": config.name,
        "label": config.label,
        "family": config.family,
        "jit_compile": config.jit_compile,
        "every_n_steps": config.every_n_steps,
        "baseline": config.baseline,
        "time_target": config.time_target,
        "memory_target": config.memory_target,
        "status": "ok",
        "note": "",
        "pairs_planned": 0,
        "pairs": [],
        "samples": [],
    }
