"""A real Spark standalone cluster for the tests: one Master and two Workers started with the
pip-installed pyspark's ``spark-class``, on 127.0.0.1 with ports the daemons pick themselves.

The daemons run from a scratch directory with a minimal environment (no PYTHONPATH, no
PYSPARK_PYTHON, no virtualenv on PATH): executors they launch cannot import this checkout, so
an application must ship its Python environment (``./run pack``, ``spark.archives``). They are
stopped by process group, whatever happens: at the end of the test session, and at exit.
"""

from __future__ import annotations

import atexit
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

import pyspark

SPARK_HOME = os.path.dirname(os.path.abspath(pyspark.__file__))
_MASTER_URL = re.compile(r"Starting Spark master at (spark://\S+)")
_REGISTERED = re.compile(r"Registering worker (\S+)")


def daemon_env(root: str) -> dict[str, str]:
    """What a cluster node's daemon sees: Java and the Spark installation, nothing of this checkout."""
    env = {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": root,
        "SPARK_HOME": SPARK_HOME,
        "SPARK_CONF_DIR": os.path.join(root, "conf"),  # empty: Spark's default INFO logging, our port lines
        "SPARK_LOG_DIR": os.path.join(root, "logs"),
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

    def _log(self, name: str) -> str:
        return os.path.join(self.root, "logs", f"{name}.log")

    def _spawn(self, name: str, *args: str) -> subprocess.Popen:
        log = open(self._log(name), "wb")  # noqa: SIM115 - the daemon owns it until stopped
        proc = subprocess.Popen(
            [os.path.join(SPARK_HOME, "bin", "spark-class"), *args],
            cwd=self.root, env=daemon_env(self.root), stdout=log, stderr=subprocess.STDOUT,
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
        for d in ("conf", "logs", "work"):
            os.makedirs(os.path.join(self.root, d), exist_ok=True)
        atexit.register(self.stop)
        self._spawn("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", "0", "--webui-port", "0")
        self.url = self._wait_for("master", _MASTER_URL, 1, timeout)[0]
        for i in range(self.workers):
            self._spawn(
                f"worker{i}", "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--port", "0",
                "--webui-port", "0", "--cores", str(self.cores), "--memory", self.memory,
                "--work-dir", os.path.join(self.root, "work"), self.url,
            )
        self._wait_for("master", _REGISTERED, self.workers, timeout)
        return self

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


def pack_environment(root: str, out: str) -> str:
    """``./run pack -o OUT``: exactly the README's command; returns the archive's path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK_", "VIRTUAL_ENV"))}
    env.pop("PYTHONPATH", None)
    # the interpreter this test's venv was made from: executors and driver then run the same Python
    env["SDT_PYTHON"] = getattr(sys, "_base_executable", None) or sys.executable
    proc = subprocess.run([os.path.join(root, "run"), "pack", "-o", out], cwd=root, env=env,
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return out
