"""``SparkModel``: train, evaluate and predict a compiled Keras 3 model on Spark data."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import time
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

from .. import backend
from .. import mlflow as tracking
from ..config import EngineConfig, FitConfig, arguments_doc, split_applicable
from ..data.adapters import DataAdapter, DataFrameAdapter, is_dataframe, is_rdd
from ..data.batching import Batch, row_signature
from ..data.output import output_columns
from ..data.transform import BatchTransform
from ..errors import ConfigError, DataError, ModelError
from ..failures import memory_error
from ..fs import FileSystem, join
from ..model_io import ModelPayload, build_from_batch, build_with, check_compiled, serialize_builder, serialize_model
from ..saving import read_saved, write_saved
from ..worker.tasks import PredictTask, StepSettings
from . import warm_up
from .backend_env import executor_backend
from .background import SparkCall
from .connect import active_connect_session, check_reachable, context_of, is_connect, unreachable_error
from .efficiency import few_steps_advice
from .engines import Engine, EpochContext, driver_host, engine_class, evaluate_logs, server_host, use_tls
from .executors import memory_kill_since, removed_executors
from .inputs import make_adapter
from .monitor import EpochStopped, FitMonitor
from .phases import Phases
from .preflight import PendingCheck
from .prepare import PendingPrepare, remember_sample, start_prepare
from .progress import FitProgress
from .registration import on_cluster, wait_for_executors
from .shared_refs import SharedRefs
from .spark_conf import conf_values, no_locality_wait, settings_conf
from .stats import EpochStats, FitStats

log = logging.getLogger(__name__)

_SAMPLE_ROWS = 8


class SparkModel:
    """A compiled Keras model trained on Spark data.

    Nothing is started in the constructor: no Spark job, no server. The model is
    serialized (and proven rebuildable) at the start of each ``fit`` /
    ``evaluate`` / ``predict``, before any Spark job.

    Args:
        model: a compiled ``keras.Model`` (Sequential, functional or subclassed; one that builds on its
            first batch is built on a few rows of the data, as ``model.fit`` builds it), or a function
            that builds and compiles one (``SparkModel(build_model)``): executors then call the function,
            shipped by value, instead of rebuilding the model from its config, so layers without a
            ``get_config`` train unchanged. Classes and functions the model uses that Keras does not
            know travel by value either way (docs/models.md).
        custom_objects: custom layers/losses/metrics the model uses (found by themselves in most cases).
{settings}

    Settings left at ``None`` come from their ``spark.sparkdl_train.*`` key, else their default;
    ``**settings`` takes the ones without a parameter of their own (``ps_port``,
    ``round_timeout``, ...). An argument that has no effect in the chosen mode is refused.
    ``sm.config`` shows what a fit would run with and where each value came from.
    """

    def __init__(
        self,
        model: Any,
        mode: str = "synchronous",
        frequency: str | int | None = None,
        num_workers: int | None = None,
        custom_objects: dict[str, Any] | None = None,
        seed: int | None = None,
        shuffle_buffer_size: int | None = None,
        worker_threads: int | None = None,
        safe_mode: bool | None = None,
        staleness_bound: int | None = None,
        delta_scale: float | None = None,
        compression: str | None = None,
        lr_scaling: str | None = None,
        allreduce_timeout: float | None = None,
        sparse_embeddings: bool | None = None,
        nan_policy: str | None = None,
        transform_threads: int | None = None,
        transform_rows: int | None = None,
        epoch_retries: int | None = None,
        epochs_per_stage: int | None = None,
        state_sums: str | None = None,
        table_average: str | None = None,
        bucket_bytes: int | None = None,
        sparse_gradients: bool | None = None,
        table_shards: int | None = None,
        ps_compression: str | None = None,
        collectives: str | None = None,
        **settings: Any,
    ):
        given = dict(locals())  # the parameters as passed; each one is a declared setting (config.py)
        for name in ("self", "model", "custom_objects", "settings", "__class__"):
            given.pop(name, None)
        import keras

        self._builder = None
        if callable(model) and not isinstance(model, keras.Model):
            self._builder = model
            model = build_with(model)  # the driver's own model (an unbuilt one is built on the fit's sample rows)
        check_compiled(model, built=False)
        self._model = model
        self._build_batch: Any = None  # the rows that built a model which builds on its first batch
        self._overrides = {k: v for k, v in {**given, **settings}.items() if v is not None}
        self._arguments = EngineConfig(**self._overrides)  # a bad or misplaced argument fails here, naming it
        self.custom_objects = dict(custom_objects or {})
        self.stats: FitStats | None = None
        self._monitor: FitMonitor | None = None
        self._columns: dict[str, Any] = {"feature_cols": "features", "label_col": "label", "sample_weight_col": None}
        self._shipped: tuple[Any, ModelPayload] | None = None  # (what the payload was built from, the payload)
        self._transform: Any = None  # the user's batch transform (DataFrames), remembered across calls

    # -- public API ---------------------------------------------------------------
    @property
    def config(self) -> EngineConfig:
        """The settings a fit started now would run with: this SparkModel's arguments over the
        active SparkContext's (or Spark Connect session's) ``spark.sparkdl_train.*`` keys over the defaults
        (``sm.config.describe()`` lists each with its source)."""
        return _resolve(_active_context(), self._overrides)

    @property
    def model(self) -> Any:
        """The driver's Keras model; after ``fit`` it holds the trained weights."""
        return self._model

    @property
    def master_network(self) -> Any:  # Elephas name
        return self._model

    @property
    def job_group(self) -> str | None:
        """The Spark job group of the running (or last) ``fit``: the caller's group if one was
        set on the calling thread, else ``sparkdl_train-fit-<id>``. Cancelling it (Spark UI,
        ``sc.cancelJobGroup``) makes ``fit`` raise :class:`~sparkdl_train.errors.FitCancelled`."""
        return self._monitor.job_group if self._monitor is not None else None

    def save(self, path: str, overwrite: bool = True) -> str:
        """Save the model (``model.keras``) and this SparkModel's training config under ``path``,
        a directory on any filesystem Spark's Hadoop API reaches (``hdfs://``, ``s3a://``,
        ``file:``; no scheme: ``fs.defaultFS``, like Spark's own writers). Returns the
        qualified path. Load with :func:`sparkdl_train.load_spark_model`."""
        settings = {
            "config": self._explicit_config(),
            "columns": self._columns,
            "custom_objects": sorted(self.custom_objects),
            "last_fit": self.stats.as_dict() if self.stats is not None else None,
        }
        return write_saved(path, self._model, settings, overwrite)

    def _explicit_config(self) -> dict[str, Any]:
        return dict(self._overrides)

    def cancel(self) -> None:
        """Cancel the running ``fit``'s Spark jobs (call from another thread); ``fit`` raises
        :class:`~sparkdl_train.errors.FitCancelled` after its servers are shut down."""
        if self._monitor is not None:
            self._monitor.cancel()

    def fit(
        self,
        data: Any,
        epochs: int = 1,
        batch_size: int = 32,
        verbose: int = 1,
        callbacks: Sequence[Any] | None = None,
        validation_split: float = 0.0,
        validation_data: Any = None,
        shuffle: bool = True,
        initial_epoch: int = 0,
        feature_cols: Any = None,
        label_col: Any = None,
        sample_weight_col: str | None = None,
        checkpoint_dir: str | None = None,
        transform: Any = None,
        mlflow: bool | None = None,
        validation_freq: Any = 1,
    ) -> Any:
        """Train on ``data`` (DataFrame, RDD of ``(x, y)``) and return a ``keras.callbacks.History``.

        ``validation_data`` may be a DataFrame, an RDD or a tuple of arrays;
        ``validation_split`` holds out a seeded random fraction of ``data``
        (Keras takes the last rows; distributed data has no "last" rows). ``validation_freq``, as
        in Keras: validate every N epochs, or after the (1-based) epochs listed.

        ``verbose=1`` draws a ``tqdm.auto`` bar per epoch, moved by the workers' live
        reports; ``2`` prints one line per epoch; ``0`` nothing. ``callbacks`` run on the
        driver through ``keras.callbacks.CallbackList``: epoch hooks get the epoch's exact
        (merged) logs; batch hooks run once per live report with the running, sample-weighted
        logs of all workers. Setting ``model.stop_training`` during an epoch cancels that
        epoch's Spark job (e.g. ``TerminateOnNaN``).

        ``checkpoint_dir`` (any Hadoop-reachable path) receives the model's weights and
        optimizer state after every completed epoch. A fit whose ``checkpoint_dir`` already
        holds a checkpoint restores it and continues with the next epoch (the returned
        ``History`` covers the epochs run by this call; ``history.epoch`` numbers them), so
        re-running a failed job's ``fit`` resumes it with the result an uninterrupted run gives.

        ``transform`` (DataFrames only) is a function from a batch's columns to the model's
        inputs, run on the executors while the model trains: decode image bytes, tokenise text,
        parse raw fields (:mod:`sparkdl_train.data.transform` states its contract;
        ``transform_threads`` / ``transform_rows`` settings). ``feature_cols``, ``label_col``
        and ``sample_weight_col`` then name its output keys. It is remembered, like the columns,
        for later ``evaluate`` / ``predict`` calls on DataFrames.

        ``mlflow``: log this fit to MLflow from the driver (settings, per-epoch metrics, throughput,
        where the tasks ran, the model); ``None`` follows :func:`sparkdl_train.mlflow.autolog`.
        """
        _not_data("fit", "epochs", epochs)
        fit_cfg = FitConfig(
            epochs=epochs,
            batch_size=batch_size,
            shuffle=shuffle,
            validation_split=validation_split,
            verbose=int(verbose),
            initial_epoch=initial_epoch,
            validation_freq=validation_freq,
        )
        if validation_data is not None and validation_split:
            raise ConfigError("pass either validation_data or validation_split, not both")
        _check_callbacks(callbacks)
        self._remember_columns(feature_cols, label_col, sample_weight_col)
        self._remember_transform(transform, data)
        with self._session(data, fit_cfg, callbacks, validation_data, checkpoint_dir, tracking.enabled(mlflow)) as (engine, loop):
            loop.logs = self._run_epochs(engine, loop)
        return self._model.history

    def fit_stream(
        self,
        stream_df: Any,
        checkpoint_location: str,
        batch_size: int = 32,
        feature_cols: Any = None,
        label_col: Any = None,
        sample_weight_col: str | None = None,
        trigger: Any = None,
        passes: int = 1,
        publish_every: int | None = None,
        publish_dir: str | None = None,
        prequential: bool = False,
        stream_retries: int = 2,
        batch_timeout: float | None = None,
        registered_model: str | None = None,
        callbacks: Sequence[Any] | None = None,
        transform: Any = None,
        query_name: str | None = None,
        shuffle: bool = True,
        mlflow: bool | None = None,
        dynamic_ids: Any = None,
    ) -> Any:
        """Train continuously on a streaming DataFrame; returns a :class:`~sparkdl_train.driver.stream.StreamFit`
        (``.query`` is the ``StreamingQuery``; ``stop()``, ``awaitTermination()``, ``batches``).

        Each micro-batch is ``passes`` training passes of this SparkModel's engine over its rows (the
        engine and its servers live as long as the query). ``checkpoint_location`` holds Spark's checkpoint
        and the model's, committed together per micro-batch: a query restarted with the same location goes
        on after the last trained micro-batch, none trained twice or skipped (docs/streaming.md).
        ``trigger``: Spark's, as a dict (``{"processingTime": "10 seconds"}``, ``{"availableNow": True}``) or
        a processing-time string. ``publish_every`` micro-batches the model is saved as a new version under
        ``publish_dir`` (``load_latest(publish_dir)`` reads the newest complete one). ``prequential``: score
        each micro-batch with the model before it trains on it (``BatchRecord.prequential``).
        ``stream_retries``: how often a failed micro-batch is trained again from the last commit.
        ``batch_timeout``: seconds a micro-batch's attempt may run; a longer one (a stalled executor, a task that
        hangs) has its Spark jobs cancelled and is retried like a failed one (default: no limit).
        ``registered_model``: with MLflow tracking on (``mlflow=True`` or ``sparkdl_train.mlflow.autolog()``), each
        published version is also logged to the query's run and registered as a version of this MLflow model,
        tagged with its micro-batch and offsets.
        ``dynamic_ids``: a list of :class:`~sparkdl_train.DynamicTable` (an integer id column and the
        ``Embedding`` layer it feeds): ids get rows of that table after a few sightings, idle ids give their rows
        up, memory bounded whatever the number of distinct ids (:mod:`sparkdl_train.driver.stream_ids`).
        ``feature_cols``, ``label_col``, ``sample_weight_col``, ``transform`` and ``callbacks`` as in ``fit``
        (epoch hooks run once per micro-batch, with its id as the epoch)."""
        from . import stream

        settings = stream.StreamSettings(batch_size=batch_size, passes=passes, publish_every=publish_every, publish_dir=publish_dir,
                                         prequential=bool(prequential), retries=stream_retries, shuffle=shuffle,
                                         registered_model=registered_model, batch_timeout=batch_timeout)
        if isinstance(trigger, str):
            trigger = {"processingTime": trigger}
        elif trigger is not None and not isinstance(trigger, dict):
            raise ConfigError(f"fit_stream: trigger is a dict of DataStreamWriter.trigger's arguments or a processing-time "
                              f"string, got {trigger!r}")
        _check_callbacks(callbacks)
        self._remember_columns(feature_cols, label_col, sample_weight_col)
        self._remember_transform(transform, stream_df)
        return stream.start(self, stream_df, settings, checkpoint_location, trigger, callbacks, query_name,
                            tracking.enabled(mlflow), dynamic_ids)

    @contextlib.contextmanager
    def _session(self, data: Any, fit_cfg: FitConfig, callbacks: Sequence[Any] | None, validation_data: Any,
                 checkpoint_dir: str | None, track: bool) -> Iterator[tuple[Engine, "_EpochLoop"]]:
        """One fit's setup, engine and cleanup around the passes its caller runs: ``fit``'s epochs, or a
        stream's micro-batches (:mod:`sparkdl_train.driver.stream`). The checks, the sample, the prepare job and
        the engine's servers happen once; the caller trains with :meth:`_one_epoch` and leaves the last logs
        in ``loop.logs``."""
        import keras

        phases = Phases()  # FitStats.phases: where the time before the first epoch goes
        model = self._model
        with phases("adapter"):
            train, config = self._adapter(data, labelled=True, what="data")
        sc = _spark_context(train)
        gone_before = set(removed_executors(sc)) if sc is not None else set()  # executors this fit did not lose
        # the sample job runs beside the driver's own work; a DataFrame's (a plain query, no code of
        # ours on the executors) even beside the model's serialization
        sample = self._start_sample(train) if train.sample_first else None
        # the executors' check (their Python workers' start: TensorFlow's import, most of a cold fit's wait)
        # runs while the driver prepares, from the model's serialization on; the sample job, submitted
        # first, takes its slot before the check's tasks wait there for the import
        check = self._start_preflight(train, config)
        with _cancelled_on_error(sample):
            with phases("payload"):  # a model that cannot be shipped fails here, before any job of this fit's
                payload = self._payload(train, sample)
        sample = sample or self._start_sample(train)
        sampled = train  # the adapter the sample reads (train becomes its split / repartitioned form)
        refs = SharedRefs(payload)
        prepare: PendingPrepare | None = None
        run: tracking.FitRun | None = None
        try:
            with _preflight_first(check), _cancelled_on_error(sample):
                with phases("validation_split"):
                    train, val = self._validation(train, validation_data, fit_cfg, config)
                with phases("executors"):  # no fit plans on a cluster that is still registering its executors
                    registration = wait_for_executors(sc, config.core.registration_timeout, config.num_workers)
                with phases("plan"):
                    engine_cls = engine_class(config)
                    launch = engine_cls.plan(config, sc, train)  # slot checks fail here, before any job
                    launch = dataclasses.replace(launch, tls=use_tls(config, sc))
                    train = train.with_partitions(launch.workers, shuffle=launch.barrier)
                threads = self._threads(train, launch.workers, config)
                settings = StepSettings(batch_size=fit_cfg.batch_size, shuffle=fit_cfg.shuffle,
                                        shuffle_buffer_size=config.data.shuffle_buffer_size, seed=config.seed, threads=threads,
                                        nan_policy=config.data.nan_policy, group=engine_cls.steps_per_call(config),
                                        bucket_bytes=config.allreduce.bucket_bytes if engine_cls.step == "fused" else 0,
                                        sparse_tables=engine_cls.sparse_tables(config, model, launch.workers, fit_cfg.batch_size))
                if config.core.prepare_workers and sc is not None:
                    # the executors rebuild the model and trace its step while the driver samples
                    with phases("prepare_start"):
                        kinds = (engine_cls.step,) + (("test",) if val is not None else ())
                        prepare = start_prepare(train, refs.payload_ref(train), settings, kinds, launch.workers, after=sample,
                                                digest=payload.digest, check=check if on_cluster(sc) else None,
                                                check_timeout=config.core.preflight_timeout + 60.0)
                batch = self._check_sample(train, "data", phases, ahead=sample)
                remember_sample(payload.digest, batch)
                settings = dataclasses.replace(settings, labels=row_signature(batch[1]))
                if val is not None:
                    self._check_sample(val, "validation_data", phases)
            with phases("preflight"):  # what is left of the check's time after the driver's preparation
                environment = check.result() if check is not None else None
            if prepare is not None:
                with phases("prepare"):  # what is left of its job once the driver is ready: the epoch's tasks go where it ran
                    prepare.go_ahead(config.core.preflight_timeout, watch=lambda: _memory_kills(sc, gone_before))
                prepare.confirms(batch)
            if config.data.cache_rdd and fit_cfg.epochs - fit_cfg.initial_epoch > 1:
                with phases("read_once"):  # an RDD of rows: read into chunks once, the epochs read those
                    train, kept = train.read_once(f"sparkdl_train fit: reading the RDD once for {fit_cfg.epochs} epochs")
                    if kept is not None:
                        refs.own(train, kept)
                    if val is not None:  # evaluated after every epoch
                        val, kept = val.read_once(f"sparkdl_train fit: reading the validation RDD once for {fit_cfg.epochs} epochs")
                        if kept is not None:
                            refs.own(val, kept)
            self.stats = FitStats(num_workers=launch.workers, worker_threads=threads, mode=config.mode, frequency=config.frequency,
                                  master=sc.master if sc is not None else None, environment=environment)
            self.stats.phases = phases.seconds
            self.stats.registration = registration.as_dict() if registration is not None else None
            self.stats.data_source = train.source
            self.stats.sample_source = sampled.sampled_by
            self.stats.steps_per_call = settings.group
            with phases("restore"):
                fit_cfg, checkpointer = self._restore(checkpoint_dir, sc, fit_cfg)  # before the engine copies the weights
            run = tracking.FitRun.start(config, dataclasses.asdict(fit_cfg)) if track else None
            if run is not None:
                callbacks = [*(callbacks or []), run.callback(self)]
            cb = keras.callbacks.CallbackList(callbacks, add_history=True, add_progbar=False, model=model,
                                              verbose=fit_cfg.verbose, epochs=fit_cfg.epochs, steps=None)
            progress = FitProgress(fit_cfg.epochs, fit_cfg.verbose, launch.workers, log_interval=config.core.log_interval)
            self.stats.tls = launch.tls
            live = fit_cfg.verbose == 1 or bool(callbacks)
            if is_connect(sc) and (engine_cls.serves_workers or live):  # executors must connect back to this client
                with phases("connect_probe"):
                    live = _connect_reach(sc, config, engine_cls, live)
            host = (server_host if live else driver_host)(config, sc)  # live: the executors report to a server here
            monitor = FitMonitor(sc, model, cb, progress, launch.workers, host, config.core.report_interval,
                                 live=live, tls=launch.tls, removed_before=gone_before, ports=config.core.port_range)
            self._monitor = monitor
            loop = _EpochLoop(train, val, refs, settings, fit_cfg, cb, progress, monitor, checkpointer, launch=launch, config=config,
                              run=run)
        except BaseException:  # before the epochs' own cleanup takes over: no job, no broadcast left
            if prepare is not None:
                prepare.cancel()
            refs.release()
            if run is not None:
                run.fail()
            raise
        model.stop_training = False
        log.info("fit: %d epochs on %d workers (mode=%s, frequency=%s)", fit_cfg.epochs, launch.workers, config.mode, config.frequency)
        engine = None
        try:
            # the job group, report server and the engine's servers live exactly this long
            with contextlib.ExitStack() as stack:
                with phases("start"):
                    if sc is not None:
                        stack.enter_context(no_locality_wait(sc))  # tasks side by side on every executor
                    stack.enter_context(monitor)
                    engine = stack.enter_context(engine_cls(config, model, sc, launch))
                cb.on_train_begin()
                yield engine, loop
                stopping = time.perf_counter()
            phases.add("stop", time.perf_counter() - stopping)
        except BaseException:
            if prepare is not None:
                prepare.cancel()
            if run is not None:
                run.fail()
            raise
        finally:
            self.stats.server = engine.stats() if engine is not None else None
            self.stats.reports = monitor.reports_received
            loop.refs.release()
            progress.close()
        if prepare is not None:  # its tasks ran before the first epoch's
            self.stats.prepare = prepare.finish()
        cb.on_train_end(loop.logs)
        if run is not None:
            run.finish(model, self.stats, batch[0])

    def _run_epochs(self, engine: Engine, loop: "_EpochLoop") -> dict[str, Any]:
        logs: dict[str, Any] = {}
        for epoch in range(loop.fit_cfg.initial_epoch, loop.fit_cfg.epochs):
            logs, stopped = self._one_epoch(engine, loop, epoch)
            if stopped or self._model.stop_training:
                break
        return logs

    def _one_epoch(self, engine: Engine, loop: "_EpochLoop", epoch: int, label: str | None = None) -> tuple[dict[str, Any], bool]:
        """Train one pass over ``loop.train`` as epoch ``epoch`` (its seed, its stats); returns its logs and
        whether it was stopped midway. ``label`` names the pass in job descriptions and the progress bar."""
        model, fit_cfg, cb, progress = self._model, loop.fit_cfg, loop.callbacks, loop.progress
        cb.on_epoch_begin(epoch)
        progress.epoch_begin(epoch)
        validated = loop.val is not None and fit_cfg.validates_after(epoch)
        # a stage of several epochs (allreduce.epochsPerStage) ends before a validation job: it holds every slot
        stage_end = next((e for e in range(epoch, fit_cfg.epochs) if loop.val is not None and fit_cfg.validates_after(e)),
                         max(epoch, fit_cfg.epochs - 1))
        ctx = EpochContext(model, loop.train, loop.refs, loop.settings, epoch, max(fit_cfg.epochs, epoch + 1), loop.monitor,
                           stage_end=stage_end, label=label)
        ph = ctx.phases
        started = time.perf_counter()
        try:
            logs, stats = engine.train_epoch(ctx)
        except EpochStopped as stop:
            engine.stopped(model)
            logs = stop.tally.logs()
            t = stop.tally
            self.stats.epochs.append(EpochStats(epoch, t.samples, t.steps, stop.seconds, {}, [], interrupted=True))
            progress.epoch_end(epoch, logs, t.samples, stop.seconds, interrupted=True)
            log.info("%s stopped early after %d samples", ctx.description, t.samples)
            cb.on_epoch_end(epoch, logs)
            return logs, True
        # the engine's own work after the job: merging, applying the state, its bookkeeping
        ph.add("merge", time.perf_counter() - started - ph.seconds.get("broadcast", 0.0) - ph.seconds.get("job", 0.0))
        if validated:
            with ph("validation"):
                val_logs = evaluate_logs(
                    model, loop.val, loop.refs, loop.settings.for_evaluation(), f"sparkdl_train fit: validation {epoch + 1}/{fit_cfg.epochs}"
                )
            logs.update({f"val_{k}": v for k, v in val_logs.items()})
        stats.phases = ph.seconds
        self.stats.epochs.append(stats)
        if len(self.stats.epochs) == 1 and stats.partitions:  # once per fit: few steps per worker (driver/efficiency.py)
            trained = [i.get("batches", 0) for i in stats.partitions.values() if i.get("samples", 0) > 0]
            advice = few_steps_advice(len(trained), sum(trained) / max(1, len(trained)), fit_cfg.batch_size, self.stats.mode)
            if advice:
                self.stats.advice.append(advice)
                log.warning("%s", advice)
        with ph("callbacks"):
            progress.epoch_end(epoch, logs, stats.samples, stats.seconds)
            log.info("%s %s (%.0f samples/s)", ctx.description,
                     " ".join(f"{k}={v:.4g}" for k, v in logs.items() if isinstance(v, float)), stats.samples_per_second)
            cb.on_epoch_end(epoch, logs)
        if loop.checkpointer is not None:  # after the callbacks: a learning-rate change is part of the state
            with ph("checkpoint"):
                loop.checkpointer.save(model, epoch + 1, logs, {"mode": self.stats.mode, "frequency": self.stats.frequency,
                                                                "num_workers": self.stats.num_workers, "epochs": fit_cfg.epochs})
        return logs, False

    def _validation(self, train: DataAdapter, validation_data: Any, fit_cfg: FitConfig, config: EngineConfig) -> tuple[DataAdapter, Any]:
        """The training data and the validation adapter (``validation_data``, or a seeded split)."""
        if validation_data is not None:
            return train, self._adapter(validation_data, labelled=True, what="validation_data", config=config)[0]
        if fit_cfg.validation_split:
            return train.random_split(fit_cfg.validation_split, config.seed)
        return train, None

    def _restore(self, checkpoint_dir: str | None, sc: Any, fit_cfg: FitConfig) -> tuple[FitConfig, Any]:
        """Resume from ``checkpoint_dir`` when it holds a checkpoint; returns the fit config to run and the checkpointer."""
        if checkpoint_dir is None:
            return fit_cfg, None
        from .checkpoint import Checkpointer

        checkpointer = Checkpointer(checkpoint_dir, sc=sc)
        restored = checkpointer.restore(self._model)
        if restored is not None:
            fit_cfg = dataclasses.replace(fit_cfg, initial_epoch=min(fit_cfg.epochs, max(fit_cfg.initial_epoch, restored.epochs_done)))
            if fit_cfg.initial_epoch >= fit_cfg.epochs:
                log.info("%s: all %d epochs are already done", checkpoint_dir, fit_cfg.epochs)
        return fit_cfg, checkpointer

    def evaluate(
        self,
        data: Any,
        batch_size: int = 32,
        return_dict: bool = False,
        feature_cols: Any = None,
        label_col: Any = None,
        sample_weight_col: str | None = None,
        transform: Any = None,
    ) -> Any:
        """Loss and metrics over all of ``data``, sample-weighted exactly like ``model.evaluate``.

        Metric *state* (totals, counts, AUC confusion counts) is summed across
        partitions, so the result equals a single-process evaluation.
        """
        _not_data("evaluate", "batch_size", batch_size)
        FitConfig(batch_size=batch_size)
        self._remember_columns(feature_cols, label_col, sample_weight_col)
        self._remember_transform(transform, data)
        adapter, conf = self._adapter(data, labelled=True, what="data")
        payload = self._payload(adapter)
        check = self._start_preflight(adapter, conf)
        with _preflight_first(check):
            sample = self._check_sample(adapter, "data")
        if check is not None:
            check.result()
        settings = StepSettings(batch_size=batch_size, threads=self._threads(adapter, adapter.parallel_tasks(), conf),
                                nan_policy=conf.data.nan_policy, labels=row_signature(sample[1]),
                                group=conf.core.steps_per_execution)
        refs = SharedRefs(payload)
        try:
            logs = evaluate_logs(self._model, adapter, refs, settings, "sparkdl_train evaluate")
        finally:
            refs.release()
        if return_dict:
            return logs
        values = list(logs.values())
        return values[0] if len(values) == 1 else values

    def predict(
        self,
        data: Any,
        batch_size: int = 256,
        feature_cols: Any = None,
        prediction_col: str = "prediction",
        transform: Any = None,
    ) -> Any:
        """Predictions, computed on the executors and never collected.

        DataFrame in -> the same DataFrame with a ``prediction_col`` column (a
        double for one value per row, an array of floats otherwise; one column
        per output for multi-output models). RDD of feature rows in -> RDD of
        prediction arrays, in order. Arrays in -> arrays. A ``transform`` (given here or remembered
        from ``fit``) runs on the DataFrame's batches as in ``fit`` and must keep every row.
        """
        _not_data("predict", "batch_size", batch_size)
        FitConfig(batch_size=batch_size)
        if feature_cols is not None:
            self._columns["feature_cols"] = feature_cols
        self._remember_transform(transform, data)
        adapter, conf = self._adapter(data, labelled=False, what="data")
        payload = self._payload(adapter)
        check = self._start_preflight(adapter, conf)
        with _preflight_first(check):
            sample_x = adapter.sample(_SAMPLE_ROWS)[0]
            try:
                sample_out = self._model.predict_on_batch(sample_x)
            except Exception as exc:  # noqa: BLE001
                raise DataError(f"the model cannot run on the given features: {type(exc).__name__}: {exc}") from exc
        if check is not None:
            check.result()
        columns = output_columns(sample_out, prediction_col)
        settings = StepSettings(batch_size=batch_size, threads=self._threads(adapter, adapter.parallel_tasks(), conf))
        refs = SharedRefs(payload)
        task = PredictTask(refs.payload_ref(adapter), refs.state_ref(adapter, self._model, False), settings)
        return adapter.predict(task.model, task.predict, columns)

    # -- helpers -------------------------------------------------------------------
    def _remember_columns(self, feature_cols: Any, label_col: Any, sample_weight_col: Any) -> None:
        if feature_cols is not None:
            self._columns["feature_cols"] = feature_cols
        if label_col is not None:
            self._columns["label_col"] = label_col
        self._columns["sample_weight_col"] = sample_weight_col

    def _remember_transform(self, transform: Any, data: Any = None) -> None:
        if transform is None:
            return
        BatchTransform(transform)  # not a function: fails here, naming it
        if data is not None and not is_dataframe(data) and not isinstance(data, DataAdapter):
            raise ConfigError(
                f"transform runs on DataFrame columns, but the data is {type(data).__name__}: for an RDD, map its "
                "elements (rdd.map(fn)) into (x, y) rows; arrays are taken as the model's inputs as they are"
            )
        self._transform = transform

    @property
    def transform(self) -> Any:
        """The batch transform DataFrame inputs go through (``fit(..., transform=fn)``); ``None``: none."""
        return self._transform

    @transform.setter
    def transform(self, fn: Any) -> None:
        if fn is not None:
            BatchTransform(fn)
        self._transform = fn

    def _payload(self, adapter: DataAdapter | None = None, sample: SparkCall | None = None) -> ModelPayload:
        """The model as executors rebuild it. Built (and proven rebuildable) once per architecture,
        compile settings and optimizer config: a later fit, evaluate or predict of the same model
        ships the same archive, so reused Python workers keep their rebuilt, traced model; the
        weights and optimizer state travel separately, every epoch. A model that builds on its first
        batch is built here on the sample rows (``sample``'s, or a few read from ``adapter``)."""
        if not self._model.built:
            if adapter is None:
                raise ModelError(f"model {self._model.name!r} is not built: fit it, or call model.build(input_shape)")
            x = (sample.result() if sample is not None else adapter.sample(_SAMPLE_ROWS))[0]
            build_from_batch(self._model, x)
            self._build_batch = x
        if self._builder is not None:
            key = ("builder", id(self._builder), id(self._build_batch), tuple(sorted((k, id(v)) for k, v in self.custom_objects.items())))
            if self._shipped is None or self._shipped[0] != key:
                self._shipped = (key, serialize_builder(self._builder, self._model, self.custom_objects, self._build_batch))
            return self._shipped[1]
        safe_mode = self._arguments.core.safe_mode  # an argument-only setting: no Spark conf key
        key = _shipping_key(self._model, self.custom_objects, safe_mode)
        if key is not None and self._shipped is not None and self._shipped[0] == key:
            return self._shipped[1]
        payload = serialize_model(self._model, self.custom_objects, safe_mode)
        self._shipped = (key, payload) if key is not None else None
        return payload

    def _adapter(self, data: Any, labelled: bool, what: str, config: EngineConfig | None = None) -> tuple[DataAdapter, EngineConfig]:
        """The data's adapter and the settings the call runs with (``config``, or resolved over
        the data's SparkContext's conf: one read of it per call)."""
        transform = None
        if self._transform is not None:
            data_cfg = self.config.data
            transform = BatchTransform(self._transform, threads=data_cfg.transform_threads, rows=data_cfg.transform_rows)
        adapter = make_adapter(data, self._model, labelled=labelled, what=what, transform=transform, **self._columns)
        config = config if config is not None else self._conf(adapter)
        if isinstance(adapter, DataFrameAdapter) and config.data.direct_parquet:
            adapter = adapter.reading_files()
        return adapter, config

    def _conf(self, adapter: DataAdapter | None = None) -> EngineConfig:
        """The settings this call runs with (over the data's SparkContext's conf, if any)."""
        return _resolve(_spark_context(adapter), self._overrides)

    @staticmethod
    def _start_preflight(adapter: DataAdapter, engine: EngineConfig) -> PendingCheck | None:
        """Once per Spark application (and kind of stage): the executors can import this
        sparkdl_train, keras and tensorflow (:mod:`sparkdl_train.driver.preflight`). Started here,
        on a helper thread, and waited for before the first job that runs our code there."""
        sc = _spark_context(adapter)
        if sc is None:
            return None
        return warm_up.start(sc, engine, adapter.spark_session())

    @staticmethod
    def _start_sample(adapter: DataAdapter) -> SparkCall:
        return SparkCall(_spark_context(adapter), functools.partial(adapter.sample, _SAMPLE_ROWS), "sparkdl_train-sample")

    @staticmethod
    def _threads(adapter: DataAdapter, workers: int, engine: EngineConfig) -> int | None:
        if engine.core.worker_threads:
            return engine.core.worker_threads
        sc = _spark_context(adapter)
        if sc is None:
            return None
        if sc.master.startswith("local"):
            return max(1, sc.defaultParallelism // max(1, workers))
        return int(conf_values(sc, ["spark.task.cpus"]).get("spark.task.cpus", "1"))

    def _check_sample(self, adapter: DataAdapter, what: str, phases: Phases | None = None, ahead: SparkCall | None = None) -> Batch:
        """Run a few rows through the driver model: catches shape/label problems before
        the long job, and builds the compiled metrics used to merge workers' metric state.
        Returns the sample batch.
        Timed as the phases ``sample`` (reading the rows, or what is left of the wait for
        ``ahead``, the sample read beforehand) and ``sample_check`` (the model's test step)."""
        phases = phases or Phases()
        with phases("sample"):
            x, y, w = ahead.result() if ahead is not None else adapter.sample(_SAMPLE_ROWS)
        outputs = _output_names(self._model)
        if y is not None and len(outputs) > 1 and not isinstance(y, (dict, list, tuple)):
            raise DataError(
                f"model {self._model.name!r} has {len(outputs)} outputs {outputs}, but {what}'s labels are one array "
                f"(label_col's columns side by side): name a label per output, label_col={{{', '.join(repr(o) + ': ...' for o in outputs)}}}"
            )
        if isinstance(y, dict) and outputs and set(y) != set(outputs):
            raise DataError(f"label_col names outputs {sorted(y)}, but model {self._model.name!r}'s outputs are {outputs}")
        try:
            with phases("sample_check"):
                _check_test_step(self._model, (x, y, w))
        except Exception as exc:  # noqa: BLE001
            shapes = {
                "x": [getattr(a, "shape", None) for a in (x.values() if isinstance(x, dict) else x if isinstance(x, list) else [x])],
                "y": getattr(y, "shape", None),
            }
            raise DataError(
                f"{what} does not fit model {self._model.name!r} (sample batch shapes {shapes}): "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        return x, y, w


def _output_names(model: Any) -> list[str]:
    """The names of a functional model's outputs (one entry per output; empty when unknown)."""
    try:
        outputs = model.outputs
    except (AttributeError, ValueError):
        return []
    names = getattr(model, "output_names", None)
    return list(names) if names and len(names) == len(outputs or []) else [f"output_{i}" for i in range(len(outputs or []))]


@dataclass
class _EpochLoop:
    """What the epoch loop of one fit needs besides the engine."""

    train: DataAdapter
    val: DataAdapter | None
    refs: SharedRefs
    settings: StepSettings
    fit_cfg: FitConfig
    callbacks: Any
    progress: FitProgress
    monitor: FitMonitor
    checkpointer: Any = None
    launch: Any = None  # the engine's Launch: how many workers, barrier or not
    config: EngineConfig | None = None
    logs: dict[str, Any] = dataclasses.field(default_factory=dict)  # the last pass's, for on_train_end
    run: Any = None  # the fit's MLflow run (sparkdl_train.mlflow.FitRun), when it tracks


SparkModel.__doc__ = SparkModel.__doc__.replace("{settings}", arguments_doc())


def _shipping_key(model: Any, custom_objects: dict[str, Any], safe_mode: bool) -> tuple | None:
    """What a model's archive depends on besides its weights (``None``: unknown, rebuild every time)."""
    import json

    try:
        return (
            model.to_json(),
            json.dumps(model.get_compile_config(), sort_keys=True, default=repr),
            json.dumps(model.optimizer.get_config(), sort_keys=True, default=repr),
            tuple(sorted((k, id(v)) for k, v in custom_objects.items())),
            safe_mode,
        )
    except Exception:  # noqa: BLE001 - a model whose config cannot be read is simply re-serialized
        return None


def _check_test_step(model: Any, batch: Batch) -> None:
    """One test step of ``model`` on ``batch``: the data meets the model's inputs, loss and compiled
    metrics (which their first update builds, as the merge of the workers' metric state needs them)
    without making the model's test function (``test_on_batch`` makes one, and on TensorFlow a symbolic
    build another pass over the model: 0.1-0.3 s of driver CPU that competes with the executors'
    prepare tasks on a small machine; TensorFlow runs it eagerly, JAX jitted: ``Backend.check_test_step``).
    The model's own ``test_function`` is left as it was; the metrics are reset before and hold this
    batch after, as ``test_on_batch`` leaves them."""
    model.reset_metrics()
    backend.current().check_test_step(model, batch)


def _memory_kills(sc: Any, gone_before: set[str]) -> None:
    """Raise the fit's error when an executor this fit lost was killed for its memory (its preparation's jobs
    run the model too: the next container would be killed as well)."""
    failure = memory_kill_since(sc, gone_before)
    if failure is not None:
        raise memory_error(failure, "preparing the first epoch")


@contextlib.contextmanager
def _cancelled_on_error(ahead: SparkCall | None) -> Iterator[None]:
    """A preparation that fails (a slot check, a bad validation split) leaves no job running."""
    try:
        yield
    except BaseException:
        if ahead is not None:
            ahead.cancel()
        raise


@contextlib.contextmanager
def _preflight_first(check: PendingCheck | None) -> Iterator[None]:
    """The driver's preparation beside a running preflight: when it fails (a sample job on
    executors that cannot run Python, say), the preflight's error, which names the executor and
    the fix, is the one raised, with the other as its context."""
    try:
        yield
    except BaseException:
        if check is not None:
            check.result()  # raises the environment's ConfigError if that is what went wrong
        raise


def _connect_reach(sc: Any, config: EngineConfig, engine_cls: type, live: bool) -> bool:
    """On a Spark Connect session the driver's servers run in this client: before the first stage,
    whether executors can connect to it. An engine whose tasks must (the parameter server) fails
    now, naming the address and the modes that need no connection back; live progress and batch
    callbacks are dropped (with a warning: the bar moves per epoch). Returns whether to serve live
    reports."""
    host = driver_host(config, sc)
    why = check_reachable(sc, host, timeout=min(config.core.connect_timeout, 5.0), ports=config.core.port_range)
    if why is None:
        return live
    if engine_cls.serves_workers:
        raise unreachable_error(config.mode, host, why)
    log.warning("fit: %s; live progress and batch callbacks need that connection, so this fit reports once per epoch "
                "(spark.sparkdl_train.ps.host sets the address executors connect to)", why)
    return False


def _active_context() -> Any:
    """The active SparkContext, or the active Spark Connect session's stand-in; ``None``: neither."""
    from pyspark import SparkContext

    sc = SparkContext._active_spark_context
    if sc is None:
        session = active_connect_session()
        if session is not None:
            return context_of(session)
    return sc


def _resolve(sc: Any, overrides: dict[str, Any]) -> EngineConfig:
    return EngineConfig.resolve(settings_conf(sc) if sc is not None else {}, **overrides)


def _not_data(method: str, name: str, value: Any) -> None:
    """Keras' ``fit(x, y)`` / ``evaluate(x, y)`` habit puts the labels into the second parameter: say so."""
    if hasattr(value, "__len__") and not isinstance(value, str) or is_rdd(value) or is_dataframe(value):
        raise ConfigError(
            f"{method}: {name} got {type(value).__name__}, which looks like data: {method} takes the data as one "
            "argument (a DataFrame, an RDD of (x, y) rows, or a tuple (x, y) of arrays), e.g. "
            f"{method}((x, y)); Elephas' {method}(x, y) form is sparkdl_train.elephas.spark_model.SparkModel's"
        )


def _check_callbacks(callbacks: Sequence[Any] | None) -> None:
    import keras

    for c in callbacks or ():
        if not isinstance(c, keras.callbacks.Callback):
            raise ConfigError(f"callbacks must be keras.callbacks.Callback instances, got {type(c).__name__}")
        freq = getattr(c, "save_freq", "epoch")
        if isinstance(c, (keras.callbacks.ModelCheckpoint, keras.callbacks.BackupAndRestore)) and isinstance(freq, int) and not isinstance(freq, bool):
            raise ConfigError(
                f"{type(c).__name__}(save_freq={c.save_freq!r}) saves every N batches, but batches run on the "
                "executors and the driver's model changes once per epoch: use save_freq='epoch'"
            )


def _spark_context(adapter: DataAdapter | None) -> Any:
    """The adapter's SparkContext (``None``: in-process data), its later stages' Python workers set
    to run the model's Keras backend (:mod:`.backend_env`)."""
    sc = adapter.spark_context() if adapter is not None else None
    if sc is not None:
        executor_backend(sc)
    return sc


def load_spark_model(path: str, custom_objects: dict[str, Any] | None = None, sc: Any = None) -> SparkModel:
    """A :class:`SparkModel` saved with ``SparkModel.save(path)`` (any Hadoop-reachable path):
    its Keras model, its explicitly given engine settings and its column mapping. Custom objects
    are not stored (no pickle): pass them again, or register them with Keras."""
    objs = dict(custom_objects or {})
    model, meta = read_saved(path, objs, sc)
    settings, dropped = split_applicable(dict(meta["config"]))
    sm = SparkModel(model, custom_objects=objs, **settings)
    if dropped:
        log.warning("%s: ignoring saved settings that do not apply to mode %r: %s", path, sm._arguments.mode, dropped)
    sm._columns.update(meta.get("columns") or {})
    return sm


def load_latest(publish_dir: str, custom_objects: dict[str, Any] | None = None, sc: Any = None) -> SparkModel:
    """The newest complete model version a ``fit_stream`` published under ``publish_dir``; its
    ``stream_version`` says which (version, path, batch id, the stream's offsets)."""
    from .stream import LATEST, latest_version

    latest = latest_version(publish_dir, sc)
    if latest is None:
        raise FileNotFoundError(f"{publish_dir} holds no model version yet ({LATEST} is missing)")
    sm = load_spark_model(latest["path"], custom_objects, sc)
    sm.stream_version = latest
    from .stream_ids import FILE, read_tables

    fs = FileSystem(sc)
    ids = join(latest["path"], FILE)
    # a version trained with dynamic_ids: the ids its embedding rows belong to (stream_ids.map_ids maps raw ids)
    sm.stream_ids = read_tables(fs.read_bytes(ids)) if fs.exists(ids) else None
    return sm
