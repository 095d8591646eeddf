"""`GradientProbe`: probe any model trained with ``model.fit``."""

import dataclasses
import os
import threading

import keras

from kgrad import backends
from kgrad.callbacks import one_per_fit, probe_output
from kgrad.logs.writer import ProbeWriter
from kgrad.plan.options import ProbeConfig
from kgrad.sinks.fanout import SinkSet, checked_sinks


class GradientProbe(keras.callbacks.Callback):
    """Captures gradients inside ``model.fit`` and logs them to TensorBoard.

    Works on any ``keras.Model`` (Sequential, Functional or subclassed) and
    on `kgrad.ProbingModel`. A model with its own ``train_step`` (a GAN, a
    VAE) is probed through the differentiations of that step: on TensorFlow
    replace ``tf.GradientTape()`` with ``kgrad.ProbeTape(self.generator)`` (or
    the sub-model that tape differentiates), on JAX ``jax.value_and_grad`` with
    `kgrad.value_and_grad`; each is logged as a run of its own,
    ``<log_dir>/<name>/kgrad``, at the ``iterations`` of the optimizer that
    applied its gradients. When ``fit`` starts, the callback installs a probing
    ``train_step`` on the model instance; when ``fit`` ends it removes it, so
    ``evaluate``, ``predict``, ``save`` and later ``fit`` calls behave exactly as
    before. Training itself is unchanged: the probed step applies the same
    gradients Keras would.

    On probed steps, activations, dJ/d(activation), dJ/dŷ, dJ/dx (float
    inputs) and the weight gradients are summarized on device (norm, mean,
    std, min, max, zero fraction, non-finite count, histogram; per weight the
    gradient norm, weight norm and update ratio). Other steps compute none of
    it and the callback reads nothing from the device on them.

    Args:
        log_dir: TensorBoard log directory; events go to ``<log_dir>/kgrad``.
            ``None`` logs nothing (use ``latest`` or ``on_probe``). Under
            ``MultiWorkerMirroredStrategy`` only the chief writes. A folder
            that holds the kgrad logs of an earlier fit is refused before
            ``fit`` starts (their steps would mix), unless ``overwrite``; a
            later fit of the same model in this process continues its run.
        layers: Which layers to capture: ``None`` (every leaf layer with
            weights), ``"all"``, a list of names or layer objects, or a
            predicate ``fn(layer) -> bool``. The cell of a recurrent layer
            is never captured (it runs once per time step inside a loop
            the tape cannot reach); the recurrent layer's output is.
        every_n_steps: Probe one step in this many (the first step of ``fit``
            is probed). The step logged is ``optimizer.iterations``.
        capture: ``"all"`` or a subset of ``("activations",
            "activation_gradients", "prediction_gradient", "input_gradient",
            "weight_gradients")``.
        histograms: Whether to log histograms besides the scalars.
        histogram_buckets: ``"log"`` (fixed buckets by sign and decade, 1e-12 to 1e4) or
            ``"linear"`` (``bucket_count`` buckets from min to max). Default ``"log"``, or
            ``"linear"`` when ``bucket_count`` is given; see docs/tags.md.
        bucket_count: Buckets per linear histogram (default 30).
        on_probe: Optional ``fn(record)`` called with each probed step's
            `kgrad.ProbeRecord`, for logging elsewhere than TensorBoard (one
            per tape and step in a model's own ``train_step``; its ``tape``
            names the tape).
        statistics: Which tags are written. ``"default"``: what people look
            at (dJ/d(activation) and dJ/dw norms, update ratios, weight
            norms, zero fractions of activations, non-finite counts of
            dJ/d(activation), ``global/*``, histograms of the gradients; per
            weight only for kernels and other weights of two or more
            dimensions, and the norms of a normalization layer's gamma and
            beta): 58 scalar tags for a 9-layer MLP. ``"all"``: every
            moment (norm, mean, std, min, max, zero fraction, non-finite
            count) and histogram of every captured tensor, and the per-weight
            tags of biases too (306 scalar tags for the same MLP). See
            docs/tags.md (`kgrad.plan.tag_names`) for the tags.
        instruments: Extra statistics, off by default: ``["per_example"]``
            logs per-example gradient norms of the weights of Dense,
            EinsumDense, Conv1D/2D, Embedding and LayerNormalization layers
            (``example_grad_norm_*/<weight path>``) and the sums from which
            ``kgrad report`` estimates the gradient noise scale
            (``noise_*/<layer>``, ``global/noise_*``), from the same backward
            pass. Layers where it is not defined (a model with a trainable
            BatchNormalization) or not supported get no tags and a warning.
            ``["optimizer"]``, from the optimizer's own state (Adam, AdamW,
            Adamax, Nadam): ``adam_rms/<weight path>``, RMS of g/(√v̂+ε), and
            ``grad_outlier_fraction/<weight path>``; with any optimizer
            ``update_rms/<weight path>``. ``["logits"]``: per output, the max
            logit, log-sum-exp, entropy and top-1 probability
            (``logit_max_mean/<output>``...). ``["attention"]``: per attention
            layer and head, the largest pre-softmax score and the entropy of
            the attention weights (``attention_logit_max/<layer>/head_<h>``,
            ``attention_entropy/<layer>/head_<h>``), on a sub-batch; for
            Keras' MultiHeadAttention and GroupedQueryAttention and KerasHub's
            GPT-2, BERT and Gemma attention. See docs/instruments.md.
        outlier_sigmas: k of ``grad_outlier_fraction/``: an entry is an
            outlier when |g − m̂| > k·√max(v̂ − m̂², 0).
        attention_examples: How many examples of each probed batch the
            attention instrument scores (the first ones; per replica).
        sinks: Where records also go, off the training thread: `kgrad.WandbSink`, `kgrad.MlflowSink`,
            `kgrad.JsonLinesSink`, a `kgrad.Sink` of your own (docs/trackers.md).
        overwrite: Replace the kgrad logs of an earlier fit in ``log_dir``
            (only its ``kgrad`` folders) instead of refusing them.

    Example:

    >>> import keras, kgrad, numpy as np, tempfile
    >>> model = keras.Sequential([keras.Input((4,)),
    ...     keras.layers.Dense(8, activation="relu", name="hidden"),
    ...     keras.layers.Dense(1, name="out")])
    >>> model.compile("adam", "mse")
    >>> probe = kgrad.GradientProbe(tempfile.mkdtemp(), every_n_steps=2)
    >>> _ = model.fit(np.ones((16, 4)), np.ones((16, 1)), batch_size=4,
    ...               callbacks=[probe], verbose=0)
    >>> probe.latest.step, "grad_norm/hidden" in probe.latest.scalars
    (2, True)
    """

    def __init__(
        self,
        log_dir=None,
        layers=None,
        every_n_steps=100,
        capture="all",
        histograms=True,
        bucket_count=None,
        on_probe=None,
        statistics="default",
        instruments=(),
        outlier_sigmas=6.0,
        attention_examples=4,
        sinks=None,
        overwrite=False,
        histogram_buckets=None,
    ):
        super().__init__()
        # A backend kgrad does not run on is named here, before fit starts or any folder exists.
        backends.current().check_supported("probe")
        self.config = ProbeConfig(
            layers=layers, every_n_steps=every_n_steps, capture=capture, histograms=histograms,
            bucket_count=bucket_count, histogram_buckets=histogram_buckets, statistics=statistics,
            instruments=instruments, outlier_sigmas=outlier_sigmas, attention_examples=attention_examples,
        )
        if on_probe is not None and not callable(on_probe):
            raise TypeError(
                f"`on_probe` must be a callable fn(record) or None. Received: on_probe={on_probe!r}."
            )
        if not isinstance(overwrite, bool):
            raise TypeError(f"`overwrite` must be True or False. Received: overwrite={overwrite!r}.")
        self.log_dir = probe_output.checked_log_dir(log_dir)
        self.overwrite = overwrite
        self.on_probe = on_probe
        self._sinks = SinkSet(checked_sinks(sinks), "GradientProbe")
        self.latest = None
        #: In a model's own ``train_step``: ``{tape name: latest ProbeRecord}``.
        self.latest_by_tape = {}
        self._writers = {}
        self._step = None
        self._fitting = False
        # Keras' JAX trainer may run on_train_batch_end in worker threads, in any order: under it.
        self._lock = threading.RLock()

    # Keras dispatches on_train_batch_end asynchronously only for callbacks that say it
    # is safe (JAX): this one reads the device only after probed executions, under `_lock`.
    async_safe = True

    def on_train_begin(self, logs=None):
        backend = backends.current()  # checked before anything is installed (no on_train_end then)
        one_per_fit.claim(self, "GradientProbe")
        backend.check_layers(self.model, self.config.layers)
        # Every worker runs the probe (its collectives need all of them); only the chief writes.
        writes = self.log_dir is not None and backend.is_chief(self.model)
        log_dir = probe_output.writable(self.log_dir) if writes else None
        if log_dir is not None:
            probe_output.claim(log_dir, self._unsynced_model, self.overwrite)
        self._sinks.open(enabled=backend.is_chief(self.model))  # before anything is installed
        try:
            self._step = backend.attach(self.model, "probe", self.config)
        except BaseException:
            self._sinks.close()  # Keras calls no on_train_end when on_train_begin raises
            raise
        self._probing_function = self.model.train_function
        # The host knows which steps an execution runs, unless an epoch of unknown length ends short.
        self._exact_count = self.model.steps_per_execution == 1 or bool(
            (self.params or {}).get("steps")
        )
        self._log_dir = log_dir
        self._writers = {}  # tape name (None: the model's own) -> ProbeWriter
        self._delivered = {}
        self.latest_by_tape = {}
        self._steps_before_epoch = 0
        self._steps_seen = 0
        self._fitting = True  # fit's validation runs evaluate with its callbacks: no warning then

    def on_train_end(self, logs=None):
        self._fitting = False
        self._collect()
        backends.current().detach(self.model, "probe")
        for writer in self._writers.values():
            writer.close()
        self._sinks.close(attach_report=True, log_dir=self._log_dir, step=getattr(self.latest, "step", 0))

    def on_test_begin(self, logs=None):
        probe_output.warn_unless_fitting(self._fitting, "evaluate")

    def on_predict_begin(self, logs=None):
        probe_output.warn_unless_fitting(self._fitting, "predict")

    def on_train_batch_begin(self, batch, logs=None):
        # Executions without a probed step run Keras' own compiled function (or, with a
        # NonFiniteGuard, the guard's alone): they cost exactly what they cost without the probe.
        unprobed_function = self._unprobed_function()
        if unprobed_function is None:
            return
        first_step = self._steps_before_epoch + batch
        last_step = first_step + self._unsynced_model.steps_per_execution - 1
        if self.config.schedule.probes_any(first_step, last_step):
            self._step.start_at(first_step)
            self._use_train_function(self._probing_function)
        else:
            self._use_train_function(unprobed_function)

    def _use_train_function(self, function):
        # Only on a change: a Keras model's __setattr__ tracking cost ~4% of small JAX steps.
        model = self._unsynced_model
        if model.train_function is not function:
            model.train_function = function

    def _unprobed_function(self):
        """The function for executions without a probed step, if this fit may run one, else ``None``.

        Asked per batch: a `NonFiniteGuard` may attach after this callback.
        """
        if not self._exact_count:
            return None
        return backends.current().unprobed_train_function(self._unsynced_model)

    @property
    def _unsynced_model(self):
        """The model without `Callback.model`'s JAX state sync (a read of every weight): per-batch code."""
        return self._model

    def on_train_batch_end(self, batch, logs=None):
        # `batch` is the last step of the execution that just ran: only probed executions read the device.
        steps_in_epoch = (self.params or {}).get("steps")
        if steps_in_epoch:
            # Keras reports a short last execution as a full one.
            batch = min(batch, steps_in_epoch - 1)
        with self._lock:
            steps_seen = self._steps_before_epoch + batch + 1
            ran_probed_step = self.config.schedule.probes_any(self._steps_seen, steps_seen - 1)
            # An end dispatched out of order finds the count ahead of it; what it
            # would have read, the next read (at the latest the epoch's end) reads.
            self._steps_seen = max(self._steps_seen, steps_seen)
            if ran_probed_step:
                self._collect()

    def on_epoch_begin(self, epoch, logs=None):
        self._steps_before_epoch = self._steps_seen

    def on_epoch_end(self, epoch, logs=None):
        self._collect()
        if self._unprobed_function() is None:
            # Keras reports a short last execution as a full one: the device counter is exact.
            self._steps_seen = self._step.steps_run()
        for writer in self._writers.values():
            writer.flush()
        self._sinks.flush()

    def _collect(self):
        with self._lock:
            self._collect_new_records()

    def _collect_new_records(self):
        if self._step is None:
            return
        for name, pipeline in self._step.pipelines().items():
            latest = self._step.latest_record if name is None else None
            records, self._delivered[name] = pipeline.read_since(
                self._delivered.get(name, 0), latest=latest
            )
            for record in records:
                if name is not None:
                    record = dataclasses.replace(record, tape=name)
                    self.latest_by_tape[name] = record
                self.latest = record
                logged = probe_output.for_tensorboard(record)
                if self._log_dir is not None:
                    self._writer(name, pipeline).write(logged)
                self._sinks.write(logged)
                if self.on_probe is not None:
                    self.on_probe(record)

    def _writer(self, tape_name, pipeline):
        if tape_name not in self._writers:
            # A tape of a model's own train_step is a run of its own.
            log_dir = self._log_dir if tape_name is None else os.path.join(self._log_dir, tape_name)
            self._writers[tape_name] = ProbeWriter(log_dir, weight_shapes=lambda: pipeline.weight_shapes)
        return self._writers[tape_name]

