"""A Spark Connect server for the tests, started from the pip-installed pyspark (its
``spark-connect`` jar ships with it) on a free loopback port, stopped by process group.

The server is a Spark driver of its own (``local[2]``, or ``local-cluster``) whose Python
workers run this venv's Python; the clients are separate processes (``tests/scripts/connect_check.py``):
creating a Connect session switches the whole Python process to Connect mode
(``SPARK_CONNECT_MODE_ENABLED``), which the classic sessions of the rest of the suite must not see.
"""

from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import sys
import time

import pyspark
from helpers import DAEMON, TEST_JVM_OPTIONS

SPARK_HOME = os.path.dirname(os.path.abspath(pyspark.__file__))
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def run_client(url: str, what: str, timeout: float = 600) -> dict:
    """``tests/scripts/connect_check.py URL WHAT`` in a process of its own; returns its RESULT JSON."""
    import json

    here = os.path.dirname(os.path.abspath(__file__))
    proc = subprocess.run([sys.executable, os.path.join(here, "connect_check.py"), url, what],
                          capture_output=True, text=True, timeout=timeout, cwd=here)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-6000:]
    return json.loads(lines[-1][len("RESULT "):])


class ConnectServer:
    """``start()`` returns once the server's gRPC port accepts connections; ``url`` is ``sc://...``."""

    def __init__(self, root: str, master: str = "local[2]", conf: dict[str, str] | None = None, python: str | None = None,
                 host: str = "127.0.0.1"):
        self.root = root
        self.host = host  # the server's gRPC port and its driver's address (a cluster's executors must reach it)
        self.master = master
        # the executors' Python: a Connect server's planner takes it from its own PYSPARK_PYTHON
        # environment variable, not from spark.pyspark.python (docs/connect.md)
        self.python = python or sys.executable
        self.port = free_port(host)
        self.conf = {
            "spark.connect.grpc.binding.address": host,
            "spark.connect.grpc.binding.port": str(self.port),
            "spark.driver.host": host,
            "spark.driver.bindAddress": host,
            "spark.ui.enabled": "false",
            "spark.python.daemon.module": DAEMON,
            "spark.sql.shuffle.partitions": "4",
            **(conf or {}),
        }
        self.proc: subprocess.Popen | None = None
        self.log = os.path.join(root, "connect-server.log")

    @property
    def url(self) -> str:
        return f"sc://{self.host}:{self.port}"

    def start(self, timeout: float = 120.0) -> "ConnectServer":
        cmd = [os.path.join(SPARK_HOME, "bin", "spark-submit"), "--master", self.master, "--class", SERVER_CLASS]
        for k, v in self.conf.items():
            cmd += ["--conf", f"{k}={v}"]
        cmd.append("spark-internal")
        env = dict(os.environ, SPARK_HOME=SPARK_HOME, PYSPARK_PYTHON=self.python)
        if TEST_JVM_OPTIONS not in env.get("JAVA_TOOL_OPTIONS", ""):
            env["JAVA_TOOL_OPTIONS"] = f"{env.get('JAVA_TOOL_OPTIONS', '')} {TEST_JVM_OPTIONS}".strip()
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(cmd, cwd=self.root, env=env, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        atexit.register(self.stop)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the Spark Connect server exited ({self.proc.returncode}):\n{self.tail()}")
            try:
                socket.create_connection((self.host, self.port), 1).close()
                return self
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"the Spark Connect server did not listen within {timeout:g} s:\n{self.tail()}")
                time.sleep(0.2)

    def tail(self, n: int = 4000) -> str:
        try:
            with open(self.log, errors="replace") as f:
                return f.read()[-n:]
        except OSError:
            return ""

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)  # the server, its executors and their Python workers
            proc.wait(30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
