"""A real Spark standalone cluster on this machine (the tests', and bench.net.links'): one Master and two Workers started with the
pip-installed pyspark's ``spark-class``, with ports the daemons pick themselves. On 127.0.0.1, or
with ``network`` (:mod:`minicluster.hosts`) on hosts of their own: the Master on the bridge's address
(the driver's side), each Worker, and so its executors and their Python workers, in a network
namespace with its own address and a shaped link; executors then reach the driver only at the
bridge's address (:attr:`StandaloneCluster.driver_host`).

The daemons run from a scratch directory with a minimal environment (no PYTHONPATH, no
PYSPARK_PYTHON, no virtualenv on PATH): executors they launch cannot import this checkout, so
an application must ship its Python environment (``./run pack``, ``spark.archives``). They are
stopped by process group, whatever happens: at the end of the test session, and at exit.

Disk: every executor unpacks the shipped environment (about 2 GB) into its work directory, as
YARN and standalone do. :meth:`StandaloneCluster.prune` removes the unpacked copies of
executors that have exited (their logs stay), so a test that kills executors over and over
holds only the live ones; the Workers' scratch (``SPARK_LOCAL_DIRS``) and the daemons'
``java.io.tmpdir`` live under the cluster's directory, and the archive copies that executors
download into them are removed once unpacked (a killed executor's would stay in /tmp for good).
"""

from __future__ import annotations

import atexit
import glob
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import pyspark

from .hosts import HostNetwork

SPARK_HOME = os.path.dirname(os.path.abspath(pyspark.__file__))
_MASTER_URL = re.compile(r"Starting Spark master at (spark://\S+)")
_REGISTERED = re.compile(r"Registering worker (\S+)")


def daemon_env(root: str, jvm_options: str = "") -> dict[str, str]:
    """What a cluster node's daemon sees: Java and the Spark installation, nothing of this checkout."""
    env = {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": root,
        "SPARK_HOME": SPARK_HOME,
        "SPARK_CONF_DIR": os.path.join(root, "conf"),  # empty: Spark's default INFO logging, our port lines
        "SPARK_LOG_DIR": os.path.join(root, "logs"),
        "SPARK_LOCAL_DIRS": os.path.join(root, "local"),  # executors' scratch: fetched archives, blocks
        # an executor downloads each --archives file into a fresh java.io.tmpdir folder before unpacking
        # it and deletes that only at a clean exit: every killed executor left 0.4 GB in /tmp
        "JAVA_TOOL_OPTIONS": f"{jvm_options} -Djava.io.tmpdir={os.path.join(root, 'tmp')}".strip(),
        "LANG": "C.UTF-8",
    }
    if os.environ.get("JAVA_HOME"):
        env["JAVA_HOME"] = os.environ["JAVA_HOME"]
    return env


@dataclass
class StandaloneCluster:
    root: str
    workers: int = 2
    cores: int = 1
    memory: str = "2g"
    url: str = ""
    procs: list[subprocess.Popen] = field(default_factory=list)
    worker_procs: dict[str, subprocess.Popen] = field(default_factory=dict)  # live Workers by log name
    replaced: list[dict] = field(default_factory=list)  # Workers found dead and replaced, with times
    network: HostNetwork | None = None  # None: every daemon on 127.0.0.1
    worker_hosts: dict[str, int] = field(default_factory=dict)  # Worker's log name -> its host's index
    unavailable: str | None = None  # why this cluster has no hosts of its own (network None)
    jvm_options: str = ""  # JAVA_TOOL_OPTIONS of the daemons and their executors (the tests': C1 only, serial GC)

    @property
    def driver_host(self) -> str:
        """The address a driver binds and advertises (``spark.driver.host``) so that executors reach it."""
        return self.network.driver_address if self.network is not None else "127.0.0.1"

    @property
    def hosts(self) -> list[str]:
        """The Workers' addresses (on loopback, one for all)."""
        return self.network.addresses if self.network is not None else ["127.0.0.1"]

    def _log(self, name: str) -> str:
        return os.path.join(self.root, "logs", f"{name}.log")

    def _spawn(self, name: str, *args: str, host: int | None = None) -> subprocess.Popen:
        log = open(self._log(name), "wb")  # noqa: SIM115 - the daemon owns it until stopped
        env, prefix = daemon_env(self.root, self.jvm_options), []
        if host is not None:  # `ip netns exec` execs the daemon: the pid (and process group) is the daemon's
            prefix = self.network.exec_prefix(host)
            env["SPARK_LOCAL_IP"] = self.network.address(host)
        proc = subprocess.Popen(
            [*prefix, os.path.join(SPARK_HOME, "bin", "spark-class"), *args],
            cwd=self.root, env=env, stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,  # its own process group: executors die with it
        )
        self.procs.append(proc)
        return proc

    def _wait_for(self, name: str, pattern: re.Pattern, count: int, timeout: float) -> list[str]:
        deadline = time.monotonic() + timeout
        while True:
            with open(self._log(name), errors="replace") as f:
                found = pattern.findall(f.read())
            if len(found) >= count:
                return found
            dead = [p.args[1] for p in self.procs if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                self.stop()
                with open(self._log(name), errors="replace") as f:
                    tail = f.read()[-3000:]
                raise RuntimeError(f"standalone cluster did not start ({name}: {count} x {pattern.pattern}; exited: {dead}):\n{tail}")
            time.sleep(0.2)

    def start(self, timeout: float = 120.0) -> "StandaloneCluster":
        for d in ("conf", "logs", "work", "local", "tmp"):
            os.makedirs(os.path.join(self.root, d), exist_ok=True)
        atexit.register(self.stop)
        self._spawn("master", "org.apache.spark.deploy.master.Master", "--host", self.driver_host, "--port", "0", "--webui-port", "0")
        self.url = self._wait_for("master", _MASTER_URL, 1, timeout)[0]
        for i in range(self.workers):
            self._start_worker(f"worker{i}", i % len(self.hosts))
        self._wait_for("master", _REGISTERED, self.workers, timeout)
        return self

    def _start_worker(self, name: str, host: int) -> None:
        self.worker_hosts[name] = host
        self.worker_procs[name] = self._spawn(
            name, "org.apache.spark.deploy.worker.Worker", "--host", self.hosts[host], "--port", "0",
            "--webui-port", "0", "--cores", str(self.cores), "--memory", self.memory,
            "--work-dir", os.path.join(self.root, "work"), self.url, host=host if self.network is not None else None,
        )

    def replace_lost_workers(self) -> list[str]:
        """Start a new Worker for each one that has exited (a node that came back, or its
        replacement); returns the new Workers' names."""
        started = []
        for name, proc in list(self.worker_procs.items()):
            if proc.poll() is None:
                continue
            del self.worker_procs[name]
            self.procs.remove(proc)  # reaped: not a daemon that failed to start
            new = f"{name.split('-')[0]}-{len(self.replaced) + 1}"
            self._start_worker(new, self.worker_hosts[name])  # the node came back: same host
            self.replaced.append({"lost": name, "pid": proc.pid, "new": new, "at": time.monotonic()})
            started.append(new)
        return started

    @contextmanager
    def replacing_lost_workers(self, interval: float = 0.2, timeout: float = 120.0):
        """While the block runs, replace any Worker that dies (as a cluster manager would); on
        leaving, wait until every replacement has registered with the Master."""
        stop = threading.Event()

        def watch() -> None:
            while not stop.wait(interval):
                self.replace_lost_workers()
                self.prune()

        watcher = threading.Thread(target=watch, name="standalone-watch", daemon=True)
        watcher.start()
        try:
            yield self
        finally:
            stop.set()
            watcher.join()
            self.replace_lost_workers()
            self._wait_for("master", _REGISTERED, self.workers + len(self.replaced), timeout)

    def prune(self) -> list[str]:
        """Remove the unpacked environments of executors no longer running (killed, or their
        application ended); returns the executor directories pruned. Their logs stay."""
        live = set()
        for cmdline in glob.glob("/proc/[0-9]*/cmdline"):
            try:
                with open(cmdline, "rb") as f:
                    args = f.read().decode(errors="replace").split("\0")
            except OSError:
                continue
            if "--executor-id" in args and "--app-id" in args:
                live.add((args[args.index("--app-id") + 1], args[args.index("--executor-id") + 1]))
        pruned = []
        for env in glob.glob(os.path.join(self.work_dir, "app-*", "*", "environment")):
            executor_dir = os.path.dirname(env)
            app = os.path.basename(os.path.dirname(executor_dir))
            if (app, os.path.basename(executor_dir)) not in live:
                shutil.rmtree(env, ignore_errors=True)
                pruned.append(executor_dir)
        # each executor's copy of the downloaded archive (Spark's fetch cache, about 0.5 GB): used
        # once, to unpack at the executor's start; a killed executor leaves it behind
        # and its download of it (java.io.tmpdir), which only a clean exit removes
        downloads = glob.glob(os.path.join(self.root, "tmp", "spark-*", "*"))
        for cache in glob.glob(os.path.join(self.root, "local", "*", "executor-*", "spark-*", "*_cache")) + downloads:
            try:
                if time.time() - os.path.getmtime(cache) > 120:
                    os.remove(cache)
            except OSError:
                pass
        return pruned

    @property
    def work_dir(self) -> str:
        return os.path.join(self.root, "work")

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def stop(self) -> None:
        """Stop every daemon and what it started (executors), by process group."""
        for p in reversed(self.procs):
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 20
        for p in self.procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)  # the group: executors left behind by a daemon too
            except (ProcessLookupError, PermissionError):
                pass
            if p.poll() is None:
                p.wait(10)
        self.procs = [p for p in self.procs if p.poll() is None]
        self.prune()
        for scratch in ("local", "tmp"):
            shutil.rmtree(os.path.join(self.root, scratch), ignore_errors=True)

