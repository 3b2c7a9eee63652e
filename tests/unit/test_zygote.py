"""sparkdl_train.worker.zygote: the executor's zygote hands its imports to the daemon Spark starts, without Spark.

This test process plays the executor JVM: it starts the zygote (owner: its own pid) and daemons
(``python -m sparkdl_train.worker.daemon``) as its children with pipes for their standard streams, as
Spark's PythonWorkerFactory does. Their Keras backend is one sparkdl_train does not train on (numpy): the
preload is then pyarrow, pandas and pyspark's, no framework, so a zygote is ready in seconds.
"""

import os
import signal
import socket
import struct
import subprocess
import sys
import time

import pytest

from sparkdl_train.worker import zygote

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="abstract sockets and SO_PEERCRED are Linux's")


def _state(**env):
    return zygote.import_state({"PYTHONHASHSEED": "0", "PATH": "/bin", **env}, "/venv/bin/python", "/venv", "3.11.7",
                               {"pyspark": "/spark/python/lib/pyspark.zip/pyspark", "sparkdl_train": "/site/sparkdl_train"})


def test_import_state_keeps_what_imports_read_and_names_a_difference():
    s = _state(KERAS_BACKEND="tensorflow", SPARK_LOCAL_DIRS="/tmp/a", SPARKDL_TRAIN_ZYGOTE_OWNER="12", TF_CPP_MIN_LOG_LEVEL="2",
               SPARKDL_TRAIN_JAX_CACHE="auto")
    assert s["env"] == {"KERAS_BACKEND": "tensorflow", "PYTHONHASHSEED": "0", "TF_CPP_MIN_LOG_LEVEL": "2"}
    assert zygote.mismatch(s, _state(KERAS_BACKEND="tensorflow", SPARK_LOCAL_DIRS="/tmp/b", TF_CPP_MIN_LOG_LEVEL="2")) is None
    assert zygote.mismatch(s, _state()) is None  # unset, they are what the preload sets: the same imports
    assert zygote.mismatch(_state(KERAS_BACKEND="jax"), _state(KERAS_BACKEND="jax", JAX_PLATFORMS="cpu")) == \
        "environment variable JAX_PLATFORMS: None here, 'cpu' in the daemon"  # JAX reads its variables as it is imported
    assert zygote.mismatch(s, _state(KERAS_BACKEND="jax", TF_CPP_MIN_LOG_LEVEL="2")) == \
        "environment variable KERAS_BACKEND: 'tensorflow' here, 'jax' in the daemon"
    other = dict(s, modules={**s["modules"], "pyspark": "/other/pyspark"})
    assert zygote.mismatch(s, other).startswith("module pyspark from '/spark/python/lib/pyspark.zip/pyspark' here")
    assert zygote.mismatch(s, dict(s, executable="/usr/bin/python3")).startswith("executable: '/venv/bin/python' here")


def test_socket_name_is_the_users_and_the_jvms():
    assert zygote.socket_name(1000, 4242) == b"\0sparkdl_train-zygote-1000-4242"


@pytest.fixture
def env():
    e = {k: v for k, v in os.environ.items() if not k.startswith(("SPARKDL_TRAIN_ZYGOTE", "KERAS_", "TF_", "XLA_", "JAX_"))}
    return {**e, "KERAS_BACKEND": "numpy", "PYTHONHASHSEED": "0", "PYTHONUNBUFFERED": "YES"}


def _start_zygote(env):
    z = subprocess.Popen([sys.executable, "-m", "sparkdl_train.worker.zygote"], stdin=subprocess.PIPE, stderr=subprocess.PIPE,
                         env={**env, zygote.ENV_OWNER: str(os.getpid())})
    deadline = time.monotonic() + 120
    for line in z.stderr:  # the zygote says when its imports are done
        if b"imports done" in line:
            return z
        assert time.monotonic() < deadline
    raise AssertionError(f"the zygote ended (rc {z.wait()})")


def _start_daemon(env):
    """A daemon as Spark starts one; returns it with the port it wrote to stdout (pyspark's daemon protocol)."""
    d = subprocess.Popen([sys.executable, "-m", "sparkdl_train.worker.daemon"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=env)
    (port,) = struct.unpack("!i", d.stdout.read(4))
    return d, port


def _served_pid(d) -> int | None:
    """The pid the zygote forked for daemon ``d`` (from its stand-in's first stderr line), None if it started as usual."""
    line = d.stderr.readline().decode()
    return int(line.split("running as pid ")[1].split(",")[0]) if "running as pid" in line else None


def _refused_silently(owner):
    """A peer that is not a child of the zygote's JVM gets no answer (this process's parent is not ``owner``)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(zygote.socket_name(os.getuid(), owner))
        try:
            s.sendall(b"\0\0\0\2{}")
            return s.recv(10) == b""
        except (ConnectionResetError, BrokenPipeError):  # closed with the request unread
            return True


def _unbound(owner):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(zygote.socket_name(os.getuid(), owner))
        except ConnectionRefusedError:
            return True
    return False


def test_the_zygote_becomes_the_daemon_spark_starts_and_ends_when_spark_says(env):
    z = _start_zygote(env)
    try:
        assert _refused_silently(os.getpid())
        # a daemon whose imports would differ (another hash seed) starts as usual, saying why; the zygote waits on
        d0, port0 = _start_daemon({**env, "PYTHONHASHSEED": "7"})
        assert "cannot serve this daemon (environment variable PYTHONHASHSEED: '0' here, '7' in the daemon)" in \
            d0.stderr.readline().decode()
        socket.create_connection(("127.0.0.1", port0), timeout=5).close()  # its own port, served by itself
        d0.stdin.close()
        d0.wait(timeout=20)  # (pyspark's own daemon exits 0 or 1 as its shutdown runs: Spark reads no status)

        d1, port1 = _start_daemon(env)
        # the daemon that listens is the zygote itself, every import done, serving the port it wrote on Spark's pipe;
        # the process Spark started (this test's child) is its stand-in
        assert _served_pid(d1) == z.pid and zygote.parent_of(d1.pid) == os.getpid()
        with open(f"/proc/{z.pid}/comm") as f:
            assert f.read().strip() == "sdt-daemon"  # what ps calls it now; no later daemon waits for it to bind
        socket.create_connection(("127.0.0.1", port1), timeout=5).close()
        assert _unbound(os.getpid())  # it served its one daemon: a second starts as usual
        d2, port2 = _start_daemon(env)
        socket.create_connection(("127.0.0.1", port2), timeout=5).close()
        d2.stdin.close()
        d2.wait(timeout=20)

        # Spark ends a daemon by closing its stdin: the zygote's daemon shuts down and its stand-in follows
        d1.stdin.close()
        assert z.wait(timeout=20) in (0, 1) and d1.wait(timeout=20) == 0
    finally:
        if z.poll() is None:
            z.stdin.close()
        z.wait(timeout=20)


def test_a_zygote_serving_a_daemon_passes_on_sigterm_and_one_serving_none_ends_with_the_jvm(env):
    z = _start_zygote(env)
    d, _ = _start_daemon(env)
    assert _served_pid(d) == z.pid
    d.send_signal(signal.SIGTERM)  # PythonWorkerFactory.stopDaemon
    # the zygote ended on it: through pyspark's handler (its shutdown), or the signal's own action where it came
    # before the handler was installed (pyspark writes its port first)
    assert z.wait(timeout=20) in (0, 1, -signal.SIGTERM)
    assert d.wait(timeout=20) == 0

    z2 = _start_zygote(env)
    z2.stdin.close()  # the JVM's end (or the plugin's shutdown) before any daemon asked
    assert z2.wait(timeout=20) == 0 and _unbound(os.getpid())


def test_without_a_zygote_the_daemon_starts_as_usual(env):
    d, port = _start_daemon(env)
    socket.create_connection(("127.0.0.1", port), timeout=5).close()
    assert zygote.parent_of(d.pid) == os.getpid()
    d.stdin.close()
    d.wait(timeout=20)
    assert b"zygote" not in d.stderr.read()


def test_a_daemon_tells_a_socket_squatter_nothing(env):
    """Another process holding the zygote's name (here this test, not a child of the daemon's JVM) gets no
    request: a daemon's streams and environment carry the JVM's secret for its workers."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as squat:
        squat.bind(zygote.socket_name(os.getuid(), os.getpid()))
        squat.listen(1)
        d, port = _start_daemon(env)
        assert "held by pid %d" % os.getpid() in d.stderr.readline().decode()
        conn, _ = squat.accept()
        conn.settimeout(10)
        assert conn.recv(100) == b""  # closed unsent
        conn.close()
        socket.create_connection(("127.0.0.1", port), timeout=5).close()  # it serves as a daemon of its own
        d.stdin.close()
        d.wait(timeout=20)


def test_a_daemon_started_before_its_zygote_has_bound_waits_for_it(env):
    """Spark may start a daemon as soon as the executor registers, while the zygote the JVM started at the same
    moment is still starting its interpreter: the daemon finds that process among the JVM's children and waits
    for its socket (here the zygote binds after a second and a half)."""
    late = ("import runpy, sys, time; time.sleep(1.5); sys.argv = ['zygote']; "
            "runpy.run_module('sparkdl_train.worker.zygote', run_name='__main__')")
    z = subprocess.Popen([sys.executable, "-c", late, "sparkdl_train.worker.zygote"], stdin=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, env={**env, zygote.ENV_OWNER: str(os.getpid())})
    try:
        assert zygote.starting_zygote(os.getpid()) == z.pid and _unbound(os.getpid())
        d, port = _start_daemon(env)
        assert _served_pid(d) == z.pid
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
        d.stdin.close()
        assert z.wait(timeout=20) in (0, 1) and d.wait(timeout=20) == 0
    finally:
        if z.poll() is None:
            z.kill()
            z.wait()
    assert zygote.starting_zygote(os.getpid()) is None  # and a JVM without one has none
