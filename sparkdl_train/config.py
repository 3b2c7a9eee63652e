"""Configuration, split by concern, with every setting declared once.

A setting is one dataclass field made by :func:`setting`: its default, its
``spark.sparkdl_train.*`` key, its :class:`Kind` (which parses the key's text and validates a
value), the modes it applies to and its documentation. Everything else is derived from those
declarations: validation, reading Spark conf, ``SparkModel``'s keyword arguments and their
documentation, ``KerasEstimator``'s converters and docs/configuration.md's table (a test
checks that table against :func:`settings_markdown`).

The groups:

- :class:`CoreConfig`: the mode, its frequency, workers, seeds and timing of the fit as a whole;
- :class:`DataConfig`: how executors read and screen their partitions;
- :class:`ParameterServerConfig`: the driver's parameter server (every mode but ``allreduce``);
- :class:`AllreduceConfig`: the barrier-mode ring allreduce.

:class:`EngineConfig` holds one of each, resolved from defaults <- Spark conf <- explicit
arguments, and remembers where each value came from (``sources``).
"""

from __future__ import annotations

import difflib
import functools
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any, Callable, ClassVar, Iterator, Mapping, Sequence

from .errors import ConfigError
from .modes import modes

FREQUENCIES = ("epoch", "batch")
COMPRESSIONS = (None, "none", "fp16", "bf16")
LR_SCALINGS = ("none", "linear", "sqrt")
STATE_SUMS = ("float64", "float32")
TABLE_AVERAGES = ("samples", "touches")
COLLECTIVES = ("ring", "xla")
NAN_POLICIES = ("fail", "skip", "ignore")
CONF_PREFIX = "spark.sparkdl_train."
PS_MODES = ("synchronous", "asynchronous", "hogwild")


# -- kinds: parse a Spark-conf string, validate (and normalise) a value ------------------------
class Kind:
    """What values a setting takes. ``check`` raises :class:`ConfigError` naming the setting."""

    optional = False

    def what(self) -> str:
        """The values, in words (without ``None``)."""
        raise NotImplementedError

    def describe(self) -> str:
        return self.what() + (" or None" if self.optional else "")

    def parse(self, raw: str) -> Any:
        raise NotImplementedError

    def valid(self, value: Any) -> bool:
        raise NotImplementedError

    def check(self, name: str, value: Any) -> Any:
        if value is None and self.optional:
            return None
        if not self.valid(value):
            raise ConfigError(f"{name} must be {self.describe()}, got {value!r}")
        return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class Int(Kind):
    min: int | None = None
    optional: bool = False

    def what(self) -> str:
        return {None: "an integer", 0: "an integer >= 0", 1: "a positive integer"}.get(self.min, f"an integer >= {self.min}")

    def parse(self, raw: str) -> int:
        return int(raw)

    def valid(self, value: Any) -> bool:
        return _is_int(value) and (self.min is None or value >= self.min)


@dataclass(frozen=True)
class Seconds(Kind):
    optional: bool = False

    def what(self) -> str:
        return "a positive number of seconds"

    def parse(self, raw: str) -> float:
        return float(raw)

    def valid(self, value: Any) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


@dataclass(frozen=True)
class Positive(Seconds):
    def what(self) -> str:
        return "a positive number"


@dataclass(frozen=True)
class Bool(Kind):
    optional: bool = False

    def what(self) -> str:
        return "True, False" if self.optional else "True or False"

    def parse(self, raw: str) -> bool:
        low = raw.strip().lower()
        if low not in ("true", "false"):
            raise ValueError(raw)
        return low == "true"

    def valid(self, value: Any) -> bool:
        return isinstance(value, bool)


@dataclass(frozen=True)
class Text(Kind):
    optional: bool = False

    def what(self) -> str:
        return "a string"

    def parse(self, raw: str) -> str:
        return raw

    def valid(self, value: Any) -> bool:
        return isinstance(value, str) and bool(value)


@dataclass(frozen=True)
class Port(Int):
    def what(self) -> str:
        return "in [0, 65535] (0 picks a free port)"

    def valid(self, value: Any) -> bool:
        return _is_int(value) and 0 <= value < 65536


@dataclass(frozen=True)
class PortRange(Text):
    def what(self) -> str:
        return "a range of ports LOW-HIGH, e.g. 40100-40199"

    def valid(self, value: Any) -> bool:
        from .net.ports import parse

        try:
            return isinstance(value, str) and parse(value) is not None
        except ConfigError:
            return False


@dataclass(frozen=True)
class Choice(Kind):
    """One of ``values`` (or of what ``values()`` returns, for lists that grow, like the modes)."""

    values: Sequence[Any] | Callable[[], Sequence[Any]] = ()
    noun: str = "value"  # "unknown <noun> ..."

    def choices(self) -> Sequence[Any]:
        return self.values() if callable(self.values) else self.values

    def what(self) -> str:
        return "one of " + ", ".join(repr(v) for v in self.choices())

    def parse(self, raw: str) -> Any:
        return None if raw.strip().lower() == "none" and None in self.choices() else raw.strip()

    def valid(self, value: Any) -> bool:
        return value in self.choices()

    def check(self, name: str, value: Any) -> Any:
        if not self.valid(value):
            shown = ", ".join(str(v) for v in self.choices() if v is not None)
            raise ConfigError(f"unknown {self.noun} {value!r}; expected one of {shown}")
        return value


@dataclass(frozen=True)
class Frequency(Kind):
    optional: bool = True  # None: the mode's default

    def what(self) -> str:
        return "'epoch', 'batch' or a positive number of batches"

    def describe(self) -> str:
        return self.what()  # None is the mode's default, not a value to offer

    def parse(self, raw: str) -> Any:
        raw = raw.strip()
        return int(raw) if raw.isdigit() else raw

    def valid(self, value: Any) -> bool:
        return value in FREQUENCIES or (_is_int(value) and value > 0)

    def check(self, name: str, value: Any) -> Any:
        if value is None or self.valid(value):
            return value
        raise ConfigError(f"unknown frequency {value!r}; expected {self.what()}")


# -- declarations -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Setting:
    """One setting: everything about it, in one place."""

    name: str  # field in its group
    arg: str  # keyword of SparkModel(...) / EngineConfig(...), also the attribute read through EngineConfig
    key: str | None  # spark.sparkdl_train.<key>, None: argument only
    kind: Kind
    default: Any
    doc: str
    group: str
    modes: tuple[str, ...] | None  # None: every mode
    inert: tuple[Any, ...]  # values that change nothing (so they are accepted with any mode)
    argument: bool  # an explicit parameter of SparkModel.__init__ (the others go through **settings)

    @property
    def conf_key(self) -> str | None:
        return CONF_PREFIX + self.key if self.key else None

    def parse(self, raw: str) -> Any:
        try:
            value = self.kind.parse(raw)
        except ValueError:
            raise ConfigError(f"{self.conf_key}={raw!r} is not {self.kind.describe()}") from None
        try:
            return self.kind.check(self.conf_key, value)
        except ConfigError as exc:
            raise ConfigError(f"{self.conf_key}={raw!r}: {exc}") from None


def setting(key: str | None, default: Any, kind: Kind, doc: str, *, arg: str | None = None,
            modes: tuple[str, ...] | None = None, inert: tuple[Any, ...] | None = None, argument: bool = True) -> Any:
    """A dataclass field declaring a setting (the field's name and group are filled in by its group)."""
    meta = {"key": key, "kind": kind, "doc": doc, "arg": arg, "modes": modes, "argument": argument,
            "inert": inert if inert is not None else (default,)}
    return field(default=default, metadata={"setting": meta})


class _Group:
    """A frozen dataclass of settings; validates every field with its kind."""

    GROUP: ClassVar[str] = ""
    MODES: ClassVar[tuple[str, ...] | None] = None  # the modes this whole group applies to

    def __post_init__(self) -> None:
        for s in self.settings():
            object.__setattr__(self, s.name, s.kind.check(s.arg, getattr(self, s.name)))

    @classmethod
    @functools.lru_cache(maxsize=None)
    def settings(cls) -> tuple[Setting, ...]:
        out = []
        for f in fields(cls):
            meta = f.metadata["setting"]
            out.append(Setting(
                name=f.name, arg=meta["arg"] or f.name, key=meta["key"], kind=meta["kind"],
                default=None if f.default is MISSING else f.default, doc=meta["doc"], group=cls.GROUP,
                modes=meta["modes"] or cls.MODES, inert=meta["inert"], argument=meta["argument"],
            ))
        return tuple(out)


@dataclass(frozen=True)
class CoreConfig(_Group):
    """The fit as a whole: how updates merge, on how many workers, seeded how, timed how."""

    GROUP: ClassVar[str] = "core"

    mode: str = setting(
        None, "synchronous", Choice(modes, "mode"),
        "How workers' updates merge: 'synchronous', 'asynchronous' or 'hogwild' through a parameter server on the "
        "driver, or 'allreduce': one Spark barrier stage per epoch, gradients averaged every step by a ring allreduce "
        "between executors.")
    frequency: Any = setting(
        None, None, Frequency(),
        "When workers send updates: 'epoch' (once per partition pass, the default), 'batch' (every step) or a number "
        "of steps N. 'allreduce': 'batch' (the default) averages gradients every step, 'epoch' trains each rank's "
        "partition locally and averages the model's state through the ring at the epoch's end.")
    num_workers: int | None = setting(
        "numWorkers", None, Int(1, optional=True), "Training partitions (default: the cluster's default parallelism, "
        "or the barrier slots for 'allreduce').")
    seed: int = setting("seed", 0, Int(), "Seeds shuffling, the validation split and each task's random layers (dropout, noise).")
    worker_threads: int | None = setting(
        "worker.threads", None, Int(1, optional=True),
        "TensorFlow threads per worker (default: cores / workers in local mode, spark.task.cpus on a cluster).")
    steps_per_execution: int = setting(
        "worker.stepsPerExecution", 16, Int(1),
        "Consecutive batches a worker runs per call of its compiled train or test step, looping inside it as Keras' "
        "compile(steps_per_execution=...) does: the same steps in the same order, without the per-call overhead "
        "(a quarter of a small model's step time on one thread). Fewer where the mode pushes more often (a divisor "
        "of the push interval: 1 for frequency='batch') and where a group of batches would exceed 8 MiB; "
        "'allreduce' steps one batch at a time. docs/performance.md.", argument=False)
    safe_mode: bool = setting(None, True, Bool(), "Passed to keras.saving.load_model on the executors.")
    host: str | None = setting(
        "ps.host", None, Text(optional=True), "Address the driver's servers (parameter server, live reports) bind to "
        "(default: spark.driver.host; on a Spark Connect session, the client's address on its route to the server).", arg="ps_host", argument=False)
    ports: str | None = setting(
        "network.ports", None, PortRange(optional=True),
        "Ports every listening socket of a fit binds, as LOW-HIGH (both included): the driver's parameter server, "
        "report server and rendezvous server, the executors' ring listeners and XLA coordinators, the Spark Connect "
        "reachability probe; open this range (with spark.driver.port and spark.blockManager.port) in a firewall "
        "between the driver's and the executors' hosts. Default: ports the system picks. ps.port, when set, must lie "
        "in it.", argument=False)
    tls: str = setting(
        "network.tls", "auto", Choice(("auto", "on", "off"), "tls"),
        "TLS for the parameter server, the ring allreduce and the report server, with a per-fit certificate pinned by "
        "fingerprint on the executors: 'on', 'off', or 'auto' (on when spark.network.crypto.enabled, spark.ssl.enabled, "
        "spark.ssl.rpc.enabled or spark.authenticate is true).", argument=False)
    connect_timeout: float = setting(
        "ps.connectTimeout", 30.0, Seconds(),
        "Seconds a worker waits to connect to the parameter server, a ring peer or the driver's report server, and "
        "that a fit waits for enough barrier slots.", argument=False)
    report_interval: float = setting(
        "progress.interval", 0.5, Seconds(), "Seconds between a worker's live progress reports.", argument=False)
    log_interval: float = setting(
        "progress.logInterval", 10.0, Seconds(),
        "Seconds between progress lines when stderr is not a terminal (spark-submit, CI).", argument=False)
    preflight: bool = setting(
        "preflight", True, Bool(), "Check once per application that executors can import sparkdl_train, keras and "
        "tensorflow (false: skip it).", argument=False)
    preflight_timeout: float = setting(
        "preflight.timeout", 300.0, Seconds(),
        "Seconds the environment check waits for executors (they may be unpacking an archive).", argument=False)
    registration_timeout: float = setting(
        "executors.registrationTimeout", 120.0, Seconds(),
        "Seconds a fit (and the environment check) waits, before planning its workers, for the executors the "
        "application asked for to register (local-cluster's N, spark.executor.instances, spark.cores.max over "
        "spark.executor.cores, dynamic allocation's minExecutors), or for the task slots num_workers needs; "
        "standalone and local-cluster schedule a first stage on whatever executor registered first. Past it the fit "
        "trains on what is there, with a warning naming the shortfall (allreduce fails without enough slots). "
        "sparkdl_train.driver.registration.", argument=False)
    jax_compilation_cache: str = setting(
        "jax.compilationCache", "auto", Text(),
        "Keras on JAX: the folder of XLA's persistent compilation cache on the driver and the executors, so that a new "
        "process (a fresh Python worker, the next application) loads the steps an earlier one compiled for the same "
        "model and shapes instead of compiling them again: 'auto' (a folder of this user's in each host's temporary "
        "directory, shared by its executors and applications), 'off', or a path (best one every executor sees). A "
        "folder owned by another user or writable by others is not used (its entries are code the process runs). "
        "docs/performance.md.", argument=False)
    jax_compilation_cache_bytes: int = setting(
        "jax.compilationCacheBytes", 1 << 30, Int(min=0),
        "Size of the JAX compilation cache's folder past which its least recently used entries are removed "
        "(JAX's jax_compilation_cache_max_size; 0: no limit).", argument=False)
    prepare_workers: bool = setting(
        "worker.prepare", True, Bool(),
        "Rebuild the model and trace its step on the executors' Python workers while the driver still prepares a "
        "fit (one short job per fit, after its sample job and beside its checks; beside the sample job for an "
        "architecture fitted before), so the first epoch's tasks find them ready. "
        "The trace is for the batches' signature from the data's column types, or from the driver's sample (RDDs, "
        "transforms); workers keep the model for every later fit of the same architecture. docs/performance.md.",
        argument=False)
    share_daemon: bool = setting(
        "worker.shareDaemon", False, Bool(),
        "Give RDD tasks the environment SQL's Arrow tasks get (SPARK_SIMPLIFIED_TRACEBACK=1), so both fork from one "
        "Python worker daemon per executor and a session training on both RDDs and DataFrames imports TensorFlow once, "
        "not twice (each fit's preflight already runs in the kind of stage its data uses). It changes the "
        "SparkContext's environment for every RDD task (shortened Python tracebacks, as SQL's already are); "
        "docs/performance.md.",
        argument=False)

    @property
    def port_range(self) -> tuple[int, int] | None:
        """``network.ports`` as ``(low, high)`` (None: any port)."""
        from .net.ports import parse

        return parse(self.ports)


@dataclass(frozen=True)
class DataConfig(_Group):
    """How executors read, shuffle and screen their partitions."""

    GROUP: ClassVar[str] = "data"

    shuffle_buffer_size: int = setting(
        "shuffleBufferSize", 16384, Int(0), "Rows held per worker when shuffling a partition's stream.")
    nan_policy: str = setting(
        "data.nanPolicy", "fail", Choice(NAN_POLICIES, "nan_policy"),
        "What a NaN or infinite feature, label or weight does: 'fail' fails the fit naming the input, partition and "
        "row; 'skip' drops such rows and counts them (skipped_rows in stats); 'ignore' feeds them unchecked.")
    transform_threads: int = setting(
        "data.transformThreads", 1, Int(1),
        "Threads per task running a fit's batch transform (1: the data thread that prefetches batches).")
    transform_rows: int = setting(
        "data.transformRows", 1024, Int(1), "Rows per call of a fit's batch transform (slices of Arrow record batches).")
    direct_parquet: bool = setting(
        "data.directParquet", True, Bool(),
        "Where a fit's or evaluation's DataFrame is a bare scan of Parquet files on a local filesystem path "
        "(spark.read.parquet, perhaps a column selection; no partition columns, filters or computed columns) and its "
        "columns are numbers, booleans, strings, binary or arrays of those, the tasks read the files' row groups with "
        "pyarrow in balanced ranges of rows instead of through Spark's reader and Arrow writer "
        "(sparkdl_train.data.parquet; docs/performance.md). predict() always reads through Spark.", argument=False)
    cache_rdd: bool = setting(
        "data.cacheRdd", False, Bool(),
        "true: where a fit of several epochs trains on an RDD of rows, a job before the first epoch groups each partition's "
        "rows into the chunks the epochs read, encodes them as plain arrays and persists them (MEMORY_AND_DISK, "
        "unpersisted when the fit ends), and every epoch reads those instead of unpickling the rows again "
        "(sparkdl_train.data.chunk_cache; docs/performance.md). false: every epoch reads the RDD.", argument=False)


@dataclass(frozen=True)
class ParameterServerConfig(_Group):
    """The parameter server on the driver (every mode but 'allreduce')."""

    GROUP: ClassVar[str] = "ps"
    MODES: ClassVar[tuple[str, ...]] = PS_MODES

    port: int = setting("ps.port", 0, Port(), "Parameter-server port (0: a free port).", arg="ps_port", argument=False)
    staleness_bound: int | None = setting(
        "ps.stalenessBound", None, Int(0, optional=True),
        "'asynchronous' only: a worker more than this many pushes ahead of the slowest waits (bounded staleness).",
        modes=("asynchronous",))
    delta_scale: float | None = setting(
        "ps.deltaScale", None, Positive(optional=True),
        "'asynchronous'/'hogwild' only: factor applied to each pushed delta (default 1 / num_workers, so K workers "
        "together take one averaged step).", modes=("asynchronous", "hogwild"))
    sparse_embeddings: bool | None = setting(
        "ps.sparseEmbeddings", None, Bool(optional=True),
        "Push only the embedding rows a worker's batches touched and pull only the rows its next batches look up, for "
        "every Embedding fed straight from a model input (None: whenever there is one; False: whole tables).",
        inert=(None, False))
    table_shards: int = setting(
        "ps.tableShards", 1, Int(1),
        "Row ranges each embedding table of the server is cut into, each under its own lock: a push's rows are "
        "added and its reply's rows gathered range by range outside the server's lock, so pushes run their row "
        "copies on several of the driver's cores at once. A reply is then consistent within each range (another "
        "push may have reached one range and not yet the next); a synchronous round adds its rows with every range "
        "locked, and the replies to its pushes hold all of them. 1: every row under the server's one lock.", inert=(1,))
    compression: str | None = setting(
        "ps.compression", None, Choice(COMPRESSIONS, "ps_compression"),
        "'fp16' or 'bf16': workers push their deltas (dense arrays and embedding rows) and receive the server's "
        "weights as float16 / bfloat16, half the bytes each way; the server keeps and adds float32, and a worker "
        "trains from the server's weights rounded to that type (fp16 keeps 11 bits of precision up to 65504; bf16 "
        "8 bits with float32's range).", arg="ps_compression", inert=(None, "none"))
    round_timeout: float = setting(
        "ps.roundTimeout", 600.0, Seconds(), "Seconds a synchronous round (or a staleness bound's wait) waits for the "
        "workers it needs; the error then names each and its executor's address.", argument=False)
    join_timeout: float = setting(
        "ps.joinTimeout", 30.0, Seconds(), "Seconds from an epoch's start during which synchronous rounds wait for the "
        "epoch's workers still connecting (then go on with those connected).", argument=False)
    idle_timeout: float = setting(
        "ps.idleTimeout", 21600.0, Seconds(), "Seconds a worker connection may stay silent.", argument=False)


@dataclass(frozen=True)
class AllreduceConfig(_Group):
    """The barrier-mode ring allreduce."""

    GROUP: ClassVar[str] = "allreduce"
    MODES: ClassVar[tuple[str, ...]] = ("allreduce",)

    timeout: float = setting(
        "allreduce.timeout", 600.0, Seconds(),
        "Seconds a rank waits for a peer (rendezvous or data) before the fit fails naming that peer.",
        arg="allreduce_timeout")
    epoch_retries: int = setting(
        "allreduce.epochRetries", 2, Int(0),
        "Spark does not re-run a failed barrier stage, so when a rank is lost (worker killed, executor lost) the "
        "epoch is re-run from its starting state, at most this many times; errors in the data or the model fail at once.")
    compression: str | None = setting(
        "allreduce.compression", None, Choice(COMPRESSIONS, "compression"),
        "'fp16' sends gradients as float16, 'bf16' as bfloat16 (half the bytes either way; bfloat16 keeps float32's "
        "range, so large gradients cannot overflow; sums are added in float32, or, with collectives='xla', in that "
        "type).", inert=(None, "none"))
    bucket_bytes: int = setting(
        "allreduce.bucketBytes", 0, Int(0),
        "frequency='batch', TensorFlow: gradients leave in buckets of about this many bytes (whole weights, from the "
        "last layer backwards) as the backward pass produces them, and a thread reduces them through the ring while "
        "the earlier layers' gradients are still computed; the update waits for the last bucket (Horovod's and DDP's "
        "overlap). 0: one vector, sent after the backward pass. The same result either way; each epoch's stats "
        "report the seconds of exchange hidden.", inert=(0,))
    sparse_gradients: bool | None = setting(
        "allreduce.sparseGradients", None, Bool(optional=True),
        "frequency='batch': the gradients of embedding tables read straight from a model input travel as "
        "the rows each step looked up (ids and rows, gathered from every rank) instead of whole tables; every rank adds "
        "them into the table's gradient in rank order, so the update is the dense exchange's. None: for each table whose "
        "rows of a batch (at most batch_size x the ids an example looks up, from every rank) are fewer bytes than the "
        "dense ring's share of it; True: every such table; False: whole tables.", inert=(None, False))
    lr_scaling: str = setting(
        "allreduce.lrScaling", "none", Choice(LR_SCALINGS, "lr_scaling"),
        "'linear' multiplies a constant learning rate by the number of ranks on the executors ('sqrt': by its square root).")
    epochs_per_stage: int = setting(
        "allreduce.epochsPerStage", 1, Int(1),
        "Epochs one barrier stage runs: Spark's stage, the state's broadcast and the ring's set-up are paid once for "
        "all of them, and each rank keeps its partition in a local file after the first. Between two epochs rank 0 "
        "sends the state to the driver, which runs the callbacks and checkpoints as usual; a callback that changes the "
        "model's state (a learning-rate schedule) ends the stage and the next one starts from the driver's state. Needs "
        "the driver's rendezvous and no validation data (validation is a Spark job of its own between epochs).")
    state_sums: str = setting(
        "allreduce.stateSums", "float64", Choice(STATE_SUMS, "state_sums"),
        "frequency='epoch' (model averaging through the ring): the type the ranks' weighted state travels and is "
        "summed in. 'float64' gives mode='synchronous', frequency='epoch''s result exactly; 'float32' halves the bytes "
        "(the mean agrees to float32's precision; integer counters stay exact).")
    table_average: str = setting(
        "allreduce.tableAverage", "samples", Choice(TABLE_AVERAGES, "table_average"),
        "frequency='epoch': how the rows of an embedding table fed straight from a model input (and their optimizer "
        "slots) are averaged. 'samples' weights every rank by its samples, like every other weight (what "
        "mode='synchronous', frequency='epoch' does); 'touches' weights each row by how often each rank's batches "
        "looked it up, so a row only some ranks trained is not pulled back towards the copies that never saw it "
        "(rows no rank looked up: by samples). One more float per row on the ring.")
    collectives: str = setting(
        "allreduce.collectives", "ring", Choice(COLLECTIVES, "collectives"),
        "frequency='batch', the JAX backend: 'xla' runs each rank as a process of one JAX job (jax.distributed: "
        "NCCL between GPUs, Gloo between CPUs) and sums the gradients with XLA's collectives inside the compiled "
        "step, on device memory (no copy to the host; XLA may overlap the sums with the backward pass); with "
        "compression the sums are taken in float16 / bfloat16 (the ring adds in float32). The "
        "ranks' coordinator listens on rank 0's executor address without authentication (JAX has none): use it "
        "on a cluster network only the job reaches. 'ring': this project's ring over authenticated sockets.",
        inert=("ring",))
    rendezvous: str = setting(
        "allreduce.rendezvous", "driver", Choice(("driver", "spark"), "rendezvous"),
        "How the ranks of an epoch's barrier stage exchange their addresses: 'driver' through a rendezvous server in "
        "the driver (milliseconds; executors must reach the driver's address, as for live progress), 'spark' through "
        "BarrierTaskContext.allGather (about 1 s per epoch: Spark polls it once a second). A Spark Connect client that "
        "executors cannot reach uses 'spark'.", argument=False)


GROUPS: dict[str, type[_Group]] = {g.GROUP: g for g in (CoreConfig, DataConfig, ParameterServerConfig, AllreduceConfig)}


@functools.lru_cache(maxsize=None)
def all_settings() -> tuple[Setting, ...]:
    return tuple(s for g in GROUPS.values() for s in g.settings())


@functools.lru_cache(maxsize=None)
def _by_arg() -> dict[str, Setting]:
    return {s.arg: s for s in all_settings()}


def _applies(s: Setting, mode: str, value: Any) -> bool:
    """Whether ``value`` of ``s`` means something in ``mode`` (a value that changes nothing always may)."""
    return s.modes is None or mode in s.modes or value in s.inert


def _mode_list(s: Setting) -> str:
    if len(s.modes) == 1:
        return f"mode={s.modes[0]!r}"
    return "modes " + " and ".join(repr(m) for m in s.modes) if len(s.modes) == 2 else "the modes " + ", ".join(repr(m) for m in s.modes)


# -- the resolved whole -------------------------------------------------------------------------
class EngineConfig:
    """The settings a fit runs with, by concern: ``core``, ``data``, ``ps``, ``allreduce``.

    ``EngineConfig(**arguments)`` takes ``SparkModel``'s keyword names (``mode``,
    ``staleness_bound``, ``allreduce_timeout``, ``ps_port``, ...); the same names read through
    (``config.staleness_bound`` is ``config.ps.staleness_bound``). :meth:`resolve` layers them
    over ``spark.sparkdl_train.*`` keys and the defaults; ``sources`` says which won for each.
    An argument that has no effect in the chosen mode is refused (a key in Spark conf is not:
    one ``spark-defaults.conf`` serves every mode).
    """

    __slots__ = ("core", "data", "ps", "allreduce", "sources")

    def __init__(self, **arguments: Any):
        self._build(arguments, {})

    @classmethod
    def resolve(cls, conf: Mapping[str, str] | None = None, **arguments: Any) -> "EngineConfig":
        """Defaults <- ``spark.sparkdl_train.*`` keys in ``conf`` <- ``arguments`` (those not None)."""
        from_conf: dict[str, Any] = {}
        for s in all_settings():
            raw = (conf or {}).get(s.conf_key) if s.key else None
            if raw is not None:
                from_conf[s.arg] = s.parse(raw)
        self = cls.__new__(cls)
        self._build({k: v for k, v in arguments.items() if v is not None}, from_conf)
        return self

    from_spark_conf = resolve  # the earlier name

    def _build(self, arguments: dict[str, Any], from_conf: dict[str, Any]) -> None:
        known = _by_arg()
        unknown = [k for k in arguments if k not in known]
        if unknown:
            hints = {k: difflib.get_close_matches(k, known, n=1) for k in unknown}
            raise ConfigError("unknown setting" + ("s " if len(unknown) > 1 else " ") + ", ".join(
                f"{k!r}" + (f" (did you mean {hints[k][0]!r}?)" if hints[k] else "") for k in unknown
            ) + "; the settings are " + ", ".join(sorted(known)))
        values = {**from_conf, **arguments}
        sources = {arg: "argument" if arg in arguments else "spark conf" if arg in from_conf else "default" for arg in known}
        groups = {}
        for name, group in GROUPS.items():
            kwargs = {s.name: values[s.arg] for s in group.settings() if s.arg in values}
            groups[name] = group(**kwargs)
        core = groups["core"]
        from .net import ports

        ports.check_port(groups["ps"].port, core.port_range, "spark.sparkdl_train.ps.port")
        if core.frequency is None:
            object.__setattr__(core, "frequency", "batch" if core.mode == "allreduce" else "epoch")
        if core.mode == "allreduce" and core.frequency not in ("batch", "epoch"):
            raise ConfigError(f"mode 'allreduce' averages gradients every step (frequency='batch') or the model's state once "
                              f"per epoch (frequency='epoch'); not {core.frequency!r}")
        if core.mode == "allreduce" and core.frequency == "batch":
            for name, inert in (("state_sums", "float64"), ("table_average", "samples")):
                if getattr(groups["allreduce"], name) != inert:
                    raise ConfigError(f"{name} applies to frequency='epoch' (the model's state averaged through the ring); "
                                      "frequency='batch' averages gradients (see compression)")
        if core.mode == "allreduce" and groups["allreduce"].collectives == "xla":
            ar = groups["allreduce"]
            if core.frequency != "batch":
                raise ConfigError("collectives='xla' sums gradients every step: it needs frequency='batch'")
            for name, inert in (("bucket_bytes", (0,)), ("sparse_gradients", (None, False))):
                if getattr(ar, name) not in inert:
                    raise ConfigError(f"{name}={getattr(ar, name)!r} is a setting of collectives='ring' (this project's "
                                      "ring); collectives='xla' sums float gradients inside XLA's step")
        if core.mode == "allreduce" and core.frequency == "epoch":
            ar = groups["allreduce"]
            for name, inert in (("compression", (None, "none")), ("lr_scaling", ("none",)), ("bucket_bytes", (0,)),
                                ("sparse_gradients", (None, False))):
                if getattr(ar, name) not in inert:
                    raise ConfigError(f"{name}={getattr(ar, name)!r} applies to gradients (allreduce, frequency='batch'); "
                                      "frequency='epoch' averages the model's state in float64")
        if core.mode == "synchronous" and core.frequency == "epoch" and groups["ps"].compression not in (None, "none"):
            raise ConfigError("ps_compression applies to the parameter server's pushes; mode='synchronous' with "
                              "frequency='epoch' merges through Spark's treeReduce, with no server")
        for arg in arguments:  # only explicit arguments: a cluster-wide key may be meant for other modes
            s = known[arg]
            if not _applies(s, core.mode, arguments[arg]):
                raise ConfigError(f"{arg} applies to {_mode_list(s)} only, not mode={core.mode!r}")
        for name, group in groups.items():
            object.__setattr__(self, name, group)
        object.__setattr__(self, "sources", sources)

    def __getattr__(self, name: str) -> Any:
        s = _by_arg().get(name)
        if s is None:
            raise AttributeError(f"EngineConfig has no setting {name!r}")
        return getattr(object.__getattribute__(self, s.group), s.name)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("EngineConfig is frozen")

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, EngineConfig) and self.to_dict() == other.to_dict()

    def __hash__(self) -> int:
        return hash(tuple(sorted((k, repr(v)) for k, v in self.to_dict().items())))

    def __reduce__(self):
        return (_rebuild, (self.to_dict(), self.sources))

    def to_dict(self) -> dict[str, Any]:
        """Every setting by its argument name."""
        return {s.arg: getattr(getattr(self, s.group), s.name) for s in all_settings()}

    def explicit(self) -> dict[str, Any]:
        """The settings given as arguments (what ``SparkModel.save`` stores)."""
        return {k: v for k, v in self.to_dict().items() if self.sources.get(k) == "argument"}

    def rows(self) -> Iterator[tuple[str, str, Any, str]]:
        """(group, argument, value, source) for every setting."""
        for s in all_settings():
            yield s.group, s.arg, getattr(getattr(self, s.group), s.name), self.sources.get(s.arg, "default")

    def __repr__(self) -> str:
        parts = []
        for name in GROUPS:
            group = getattr(self, name)
            parts.append(f"{name}=" + repr(group))
        return "EngineConfig(" + ", ".join(parts) + ")"

    def describe(self) -> str:
        """A table of every setting that will run, its value and where it came from."""
        rows = [(f"{group}.{arg}", repr(value), source) for group, arg, value, source in self.rows()]
        w0, w1 = max(len(r[0]) for r in rows), max(len(r[1]) for r in rows)
        lines = [f"{'setting':<{w0}}  {'value':<{w1}}  source"]
        lines += [f"{a:<{w0}}  {b:<{w1}}  {c}" for a, b, c in rows]
        return "\n".join(lines)


def _rebuild(values: dict[str, Any], sources: dict[str, str]) -> EngineConfig:
    cfg = EngineConfig.__new__(EngineConfig)
    explicit = {k: v for k, v in values.items() if sources.get(k) == "argument"}
    implicit = {k: v for k, v in values.items() if sources.get(k) != "argument"}
    cfg._build(explicit, implicit)
    object.__setattr__(cfg, "sources", dict(sources))
    return cfg


def split_applicable(arguments: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(kept, dropped)``: the arguments that apply to their ``mode`` and those that do not (or
    are unknown). For settings saved by an earlier version, which accepted both."""
    known = _by_arg()
    mode = arguments.get("mode") or known["mode"].default
    kept, dropped = {}, {}
    for k, v in arguments.items():
        s = known.get(k)
        (kept if s is not None and _applies(s, mode, v) else dropped)[k] = v
    return kept, dropped


def check_setting(arg: str, value: Any) -> Any:
    """Validate one setting by its argument name (``KerasEstimator``'s params use this)."""
    s = _by_arg().get(arg)
    if s is None:
        EngineConfig(**{arg: value})  # raises the unknown-setting error with its hint
    return s.kind.check(arg, value)


def argument_settings() -> tuple[Setting, ...]:
    """The settings that are explicit keyword parameters of ``SparkModel``."""
    return tuple(s for s in all_settings() if s.argument)


def settings_markdown() -> str:
    """docs/configuration.md's table of every setting."""
    rows = ["| argument | Spark conf key | default | applies to | meaning |", "| --- | --- | --- | --- | --- |"]
    for s in all_settings():
        allowed = s.modes
        rows.append("| `{}` | {} | {} | {} | {} |".format(
            s.arg, f"`{s.conf_key}`" if s.key else "", f"`{s.default!r}`",
            "all modes" if allowed is None or tuple(allowed) == tuple(modes()) else ", ".join(f"`{m}`" for m in allowed),
            s.doc.replace("|", "\\|"),
        ))
    return "\n".join(rows)


def arguments_doc(indent: str = "        ") -> str:
    """``Args:`` entries for the settings, for ``SparkModel``'s docstring."""
    import textwrap

    out = []
    for s in all_settings():
        key = f" Spark conf: ``{s.conf_key}``." if s.key else ""
        text = textwrap.fill(f"{s.arg}: {s.doc}{key}", width=100, initial_indent=indent, subsequent_indent=indent + "    ")
        out.append(text)
    return "\n".join(out)


@dataclass(frozen=True)
class FitConfig:
    """Arguments of one ``fit`` call."""

    epochs: int = 1
    batch_size: int = 32
    shuffle: bool = True
    validation_split: float = 0.0
    verbose: int = 1
    initial_epoch: int = 0
    validation_freq: Any = 1  # Keras': validate every N epochs, or after the (1-based) epochs listed

    def __post_init__(self) -> None:
        Int(1).check("epochs", self.epochs)
        Int(1).check("batch_size", self.batch_size)
        if not isinstance(self.validation_split, (int, float)) or not 0.0 <= self.validation_split < 1.0:
            raise ConfigError(f"validation_split must be in [0, 1), got {self.validation_split!r}")
        if not _is_int(self.initial_epoch) or not 0 <= self.initial_epoch <= self.epochs:
            raise ConfigError(f"initial_epoch must be in [0, epochs], got {self.initial_epoch!r}")
        if self.verbose not in (0, 1, 2, True, False):
            raise ConfigError(f"verbose must be 0, 1 or 2, got {self.verbose!r}")
        freq = self.validation_freq
        if isinstance(freq, (list, tuple)):
            if not all(_is_int(e) and e >= 1 for e in freq):
                raise ConfigError(f"validation_freq as a list names epochs from 1, got {freq!r}")
            object.__setattr__(self, "validation_freq", tuple(sorted(set(freq))))
        elif not _is_int(freq) or freq < 1:
            raise ConfigError(f"validation_freq must be a positive integer or a list of epochs, got {freq!r}")

    def validates_after(self, epoch: int) -> bool:
        """Whether validation runs after ``epoch`` (0-based), as Keras' ``validation_freq`` says."""
        freq = self.validation_freq
        return epoch + 1 in freq if isinstance(freq, tuple) else (epoch + 1) % freq == 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


if __name__ == "__main__":  # python -m sparkdl_train.config: docs/configuration.md's table
    print(settings_markdown())
