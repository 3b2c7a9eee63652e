"""Typed, validated configuration objects.

Every field is checked in ``__post_init__`` so a bad value fails on the driver,
with the argument's name, before any Spark job starts.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

from .errors import ConfigError
from .modes import modes

FREQUENCIES = ("epoch", "batch")
COMPRESSIONS = (None, "none", "fp16")
LR_SCALINGS = ("none", "linear", "sqrt")
NAN_POLICIES = ("fail", "skip", "ignore")
CONF_PREFIX = "spark.sparkdl_train."


def _positive_int(name: str, value: Any, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")


def _bool(raw: str) -> bool:
    low = raw.strip().lower()
    if low not in ("true", "false"):
        raise ValueError(raw)
    return low == "true"


_bool.__name__ = "boolean (true/false)"


@dataclass(frozen=True)
class EngineConfig:
    """How updates from workers are merged (``SparkModel(mode=..., frequency=...)``)."""

    mode: str = "synchronous"
    frequency: str | int | None = None  # None: "batch" for allreduce, "epoch" otherwise
    num_workers: int | None = None
    seed: int = 0
    shuffle_buffer_size: int = 16384
    worker_threads: int | None = None
    safe_mode: bool = True
    nan_policy: str = "fail"  # non-finite features/labels: fail the task, skip the rows, or ignore
    # parameter server (modes other than synchronous/epoch)
    staleness_bound: int | None = None
    delta_scale: float | None = None  # async/hogwild: None -> 1 / workers
    ps_host: str | None = None
    ps_port: int = 0
    round_timeout: float = 600.0
    join_timeout: float = 30.0
    connect_timeout: float = 30.0
    idle_timeout: float = 21600.0
    report_interval: float = 0.5  # seconds between a worker's live progress reports
    log_interval: float = 10.0  # seconds between progress lines when stderr is no terminal (spark-submit, CI)
    preflight: bool = True  # check once per application that executors can import sparkdl_train/keras/tensorflow
    preflight_timeout: float = 300.0  # seconds the check waits for executors (they may be unpacking an archive)
    sparse_embeddings: bool | None = None  # push/pull embedding rows, not whole tables (None: when possible)
    # allreduce (barrier mode)
    allreduce_timeout: float = 600.0  # a rank waits at most this long for a peer or the rendezvous
    epoch_retries: int = 2  # allreduce: a failed barrier stage is re-run from the epoch's start this often
    compression: str | None = None  # "fp16": gradients cross the wire as float16
    lr_scaling: str = "none"  # "linear" (x ranks) or "sqrt" applied on the executors

    def __post_init__(self) -> None:
        if self.mode not in modes():
            raise ConfigError(f"unknown mode {self.mode!r}; expected one of {', '.join(modes())}")
        if self.frequency is None:
            object.__setattr__(self, "frequency", "batch" if self.mode == "allreduce" else "epoch")
        freq = self.frequency
        if isinstance(freq, bool) or not (freq in FREQUENCIES or (isinstance(freq, int) and freq > 0)):
            raise ConfigError(
                f"unknown frequency {freq!r}; expected 'epoch', 'batch' or a positive number of batches"
            )
        _positive_int("num_workers", self.num_workers, allow_none=True)
        _positive_int("worker_threads", self.worker_threads, allow_none=True)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ConfigError(f"seed must be an integer, got {self.seed!r}")
        if isinstance(self.shuffle_buffer_size, bool) or not isinstance(self.shuffle_buffer_size, int) or self.shuffle_buffer_size < 0:
            raise ConfigError(f"shuffle_buffer_size must be an integer >= 0, got {self.shuffle_buffer_size!r}")
        if self.staleness_bound is not None:
            if isinstance(self.staleness_bound, bool) or not isinstance(self.staleness_bound, int) or self.staleness_bound < 0:
                raise ConfigError(f"staleness_bound must be an integer >= 0, got {self.staleness_bound!r}")
            if self.mode != "asynchronous":
                raise ConfigError(f"staleness_bound applies to mode='asynchronous' only, not {self.mode!r}")
        if self.delta_scale is not None:
            if isinstance(self.delta_scale, bool) or not isinstance(self.delta_scale, (int, float)) or not self.delta_scale > 0:
                raise ConfigError(f"delta_scale must be a positive number, got {self.delta_scale!r}")
            if self.mode not in ("asynchronous", "hogwild"):
                raise ConfigError(f"delta_scale applies to modes 'asynchronous' and 'hogwild' only, not {self.mode!r}")
        if isinstance(self.ps_port, bool) or not isinstance(self.ps_port, int) or not 0 <= self.ps_port < 65536:
            raise ConfigError(f"ps_port must be in [0, 65535] (0 picks a free port), got {self.ps_port!r}")
        for name in ("round_timeout", "join_timeout", "connect_timeout", "idle_timeout", "allreduce_timeout", "report_interval",
                     "log_interval", "preflight_timeout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ConfigError(f"{name} must be a positive number of seconds, got {value!r}")
        if isinstance(self.epoch_retries, bool) or not isinstance(self.epoch_retries, int) or self.epoch_retries < 0:
            raise ConfigError(f"epoch_retries must be an integer >= 0, got {self.epoch_retries!r}")
        if self.nan_policy not in NAN_POLICIES:
            raise ConfigError(f"unknown nan_policy {self.nan_policy!r}; expected one of {', '.join(NAN_POLICIES)}")
        if not isinstance(self.preflight, bool):
            raise ConfigError(f"preflight must be True or False, got {self.preflight!r}")
        if self.sparse_embeddings not in (None, True, False):
            raise ConfigError(f"sparse_embeddings must be True, False or None, got {self.sparse_embeddings!r}")
        if self.sparse_embeddings and self.mode == "allreduce":
            raise ConfigError("sparse_embeddings applies to the parameter-server modes; mode='allreduce' averages dense gradients")
        if self.compression not in COMPRESSIONS:
            raise ConfigError(f"unknown compression {self.compression!r}; expected 'fp16' or None")
        if self.lr_scaling not in LR_SCALINGS:
            raise ConfigError(f"unknown lr_scaling {self.lr_scaling!r}; expected one of {', '.join(LR_SCALINGS)}")
        if self.mode == "allreduce":
            if freq != "batch":
                raise ConfigError(
                    f"mode 'allreduce' averages gradients every step; frequency must be 'batch', not {freq!r}"
                )
        elif self.compression not in (None, "none") or self.lr_scaling != "none":
            raise ConfigError(f"compression and lr_scaling apply to mode='allreduce' only, not {self.mode!r}")

    @classmethod
    def from_spark_conf(cls, conf: Mapping[str, str], **overrides: Any) -> "EngineConfig":
        """Defaults <- ``spark.sparkdl_train.*`` keys <- explicit arguments (non-None)."""
        keys = {
            "numWorkers": ("num_workers", int),
            "seed": ("seed", int),
            "shuffleBufferSize": ("shuffle_buffer_size", int),
            "worker.threads": ("worker_threads", int),
            "ps.host": ("ps_host", str),
            "ps.port": ("ps_port", int),
            "ps.stalenessBound": ("staleness_bound", int),
            "ps.deltaScale": ("delta_scale", float),
            "ps.roundTimeout": ("round_timeout", float),
            "ps.connectTimeout": ("connect_timeout", float),
            "ps.idleTimeout": ("idle_timeout", float),
            "ps.joinTimeout": ("join_timeout", float),
            "ps.sparseEmbeddings": ("sparse_embeddings", _bool),
            "progress.interval": ("report_interval", float),
            "progress.logInterval": ("log_interval", float),
            "preflight": ("preflight", _bool),
            "preflight.timeout": ("preflight_timeout", float),
            "data.nanPolicy": ("nan_policy", str),
            "allreduce.timeout": ("allreduce_timeout", float),
            "allreduce.epochRetries": ("epoch_retries", int),
            "allreduce.compression": ("compression", str),
            "allreduce.lrScaling": ("lr_scaling", str),
        }
        values: dict[str, Any] = {}
        for key, (name, conv) in keys.items():
            raw = conf.get(CONF_PREFIX + key)
            if raw is not None:
                try:
                    values[name] = conv(raw)
                except ValueError:
                    raise ConfigError(f"{CONF_PREFIX + key}={raw!r} is not a valid {conv.__name__}") from None
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class FitConfig:
    """Arguments of one ``fit`` call."""

    epochs: int = 1
    batch_size: int = 32
    shuffle: bool = True
    validation_split: float = 0.0
    verbose: int = 1
    initial_epoch: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _positive_int("epochs", self.epochs)
        _positive_int("batch_size", self.batch_size)
        if not isinstance(self.validation_split, (int, float)) or not 0.0 <= self.validation_split < 1.0:
            raise ConfigError(f"validation_split must be in [0, 1), got {self.validation_split!r}")
        if isinstance(self.initial_epoch, bool) or not isinstance(self.initial_epoch, int) or not 0 <= self.initial_epoch <= self.epochs:
            raise ConfigError(f"initial_epoch must be in [0, epochs], got {self.initial_epoch!r}")
        if self.verbose not in (0, 1, 2, True, False):
            raise ConfigError(f"verbose must be 0, 1 or 2, got {self.verbose!r}")
