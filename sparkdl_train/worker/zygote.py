"""The worker daemon's imports, started with the executor: a process that imports what the daemon would and
becomes the daemon when Spark starts one.

Spark starts an executor's Python worker daemon at the executor's first Python task, and
:mod:`sparkdl_train.worker.daemon` then imports TensorFlow and Keras (3 to 10 s): the largest part of a
session's first fit, paid after the fit has begun. With the executor plugin of :mod:`sparkdl_train.jvm`
(``spark.plugins=org.sparkdl_train.ExecutorStart``) every executor, as it starts (a YARN container, a
standalone worker's executor, ``local[*]``'s one), also starts ``python -m sparkdl_train.worker.zygote``
with the interpreter and environment its daemons will have. That process binds a socket at once, then
imports what the daemon preloads, and waits. When Spark later starts the daemon, the daemon asks it over
the socket (:func:`handoff`), sending its standard streams and its environment; the zygote takes the
streams, the environment, the path and the folder, and runs pyspark's daemon with every import done, in
its own process (no fork: one copy of the imports per executor, as without it, which YARN's memory check
counts per process). The process Spark started stays as its stand-in, passing Spark's signals on and ending
when the daemon ends. The zygote serves one daemon (its process is then named ``sdt-daemon``): a second one
(an environment of its own) starts as usual. A daemon that Spark starts before the zygote has bound its socket
(both start as the executor registers) finds it among the JVM's children in /proc and waits for it.

The socket is in Linux's abstract namespace, named by the user and the executor JVM's pid (the daemon's
parent): ``sparkdl_train-zygote-<uid>-<pid>``. The zygote serves a peer only when the kernel says it runs
as the same user and is a child of that JVM (``SO_PEERCRED``), a daemon talks to a zygote only on the same
terms (its streams and environment hold the JVM's secret for its workers), and only when what its own imports
depended on is the peer's too (:func:`import_state`: the interpreter, where pyspark and sparkdl_train are
imported from, the hash seed and the variables the frameworks read as they load); otherwise, as when there
is no zygote, the daemon starts as it always did. Messages are JSON, never pickle. A zygote that served no
daemon ends when the JVM closes its standard input (the plugin's shutdown, or the JVM's end); one that
became the daemon ends as Spark ends its daemon. ``SPARKDL_TRAIN_ZYGOTE=off`` (``spark.executorEnv.``)
turns the daemons' request off.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import struct
import sys
import time
from typing import Any

ENV_OWNER = "SPARKDL_TRAIN_ZYGOTE_OWNER"  # the executor JVM's pid, set by the plugin for the zygote
ENV_SWITCH = "SPARKDL_TRAIN_ZYGOTE"  # "off": a daemon does not ask
ENV_MARK = "SPARKDL_TRAIN_ZYGOTE_DAEMON"  # in a served daemon's (and its workers') environment: "<zygote pid> <JVM pid> <imports' seconds>"
PROTOCOL = 1
# variables read at import by what the zygote imports (pyspark's module constants, TensorFlow's and the
# BLAS libraries' loaders, the code store's folder, the hash seed fixed at the interpreter's start); compared
# between the zygote and a daemon (JAX reads its JAX_ variables as it is imported; XLA_FLAGS at a worker's first computation)
COMPARED = ("PYTHONHASHSEED", "PYSPARK_ENABLE_NAMEDTUPLE_PATCH", "SPARK_TESTING", "LD_LIBRARY_PATH", "LD_PRELOAD",
            "PYTHONDONTWRITEBYTECODE", "PYTHONWARNINGS", "SPARKDL_TRAIN_CODE_CACHE")
COMPARED_PREFIXES = ("KERAS_", "TF_", "JAX_", "XLA_", "CUDA_", "NVIDIA_", "OMP_", "MKL_")
NOT_COMPARED = (ENV_OWNER, ENV_SWITCH, ENV_MARK)
READY_TIMEOUT = 300.0  # a daemon waits at most this long for a zygote still importing
BIND_TIMEOUT = 30.0  # ... and this long for one whose interpreter has not bound its socket yet
DAEMON_NAME = b"sdt-daemon"  # a zygote's process name once it is a daemon (/proc/PID/comm)
_HEADER = struct.Struct("!I")


def socket_name(uid: int, owner: int) -> bytes:
    """The zygote's abstract socket address for ``uid``'s executor JVM ``owner``."""
    return f"\0sparkdl_train-zygote-{uid}-{owner}".encode()


def import_state(environ: dict[str, str], executable: str, prefix: str, version: str, modules: dict[str, str | None]) -> dict[str, Any]:
    """What a process's imports depend on (pure): its interpreter, the files ``modules`` resolve to and the
    environment's import-time variables."""
    from .preload import ENV_DEFAULTS  # unset, these variables are what both processes' preload sets: compared as set

    environ = {**ENV_DEFAULTS, **environ}
    env = {k: v for k, v in environ.items() if k not in NOT_COMPARED and (k in COMPARED or k.startswith(COMPARED_PREFIXES))}
    # pyspark sets the hash seed for its workers ("0" when the driver has none): unset counts as Python's default
    return {"executable": executable, "prefix": prefix, "version": version, "modules": dict(sorted(modules.items())),
            "env": dict(sorted(env.items()))}


def mismatch(mine: dict[str, Any], theirs: dict[str, Any]) -> str | None:
    """Why a daemon whose import state is ``theirs`` must not run on imports made under ``mine`` (pure);
    None when they agree."""
    for key in ("executable", "prefix", "version"):
        if mine.get(key) != theirs.get(key):
            return f"{key}: {mine.get(key)!r} here, {theirs.get(key)!r} in the daemon"
    for name in sorted(set(mine.get("modules", {})) | set(theirs.get("modules", {}))):
        a, b = mine.get("modules", {}).get(name), theirs.get("modules", {}).get(name)
        if a != b:
            return f"module {name} from {a!r} here, {b!r} in the daemon"
    e1, e2 = mine.get("env", {}), theirs.get("env", {})
    for k in sorted(set(e1) | set(e2)):
        if e1.get(k) != e2.get(k):
            return f"environment variable {k}: {e1.get(k)!r} here, {e2.get(k)!r} in the daemon"
    return None


def module_origins(names: tuple[str, ...] = ("pyspark", "sparkdl_train", "keras", "tensorflow", "jax", "jaxlib", "numpy", "pyarrow")) -> dict[str, str | None]:
    """Where ``names`` are (or would be) imported from in this process, without importing them."""
    import importlib.util

    out: dict[str, str | None] = {}
    for name in names:
        mod = sys.modules.get(name)
        if mod is not None and getattr(mod, "__file__", None):
            out[name] = os.path.dirname(os.path.abspath(mod.__file__))
            continue
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        out[name] = os.path.dirname(os.path.abspath(spec.origin)) if spec is not None and spec.origin else None
    return out


def _this_state() -> dict[str, Any]:
    return import_state(dict(os.environ), sys.executable, sys.prefix, sys.version, module_origins())


def _send(sock: socket.socket, obj: dict[str, Any], fds: list[int] | None = None) -> None:
    data = json.dumps(obj).encode()
    if fds:
        socket.send_fds(sock, [_HEADER.pack(len(data)) + data], fds)
    else:
        sock.sendall(_HEADER.pack(len(data)) + data)


def _recv(sock: socket.socket, max_fds: int = 0) -> tuple[dict[str, Any], list[int]]:
    fds: list[int] = []
    buf = b""
    while len(buf) < _HEADER.size:
        if max_fds and not fds:
            chunk, got, _flags, _addr = socket.recv_fds(sock, 1 << 16, max_fds)
            fds.extend(got)
        else:
            chunk = sock.recv(1 << 16)
        if not chunk:
            raise EOFError("the peer closed the connection")
        buf += chunk
    (size,) = _HEADER.unpack(buf[:_HEADER.size])
    if size > 1 << 24:
        raise ValueError(f"message of {size} bytes")
    buf = buf[_HEADER.size:]
    while len(buf) < size:
        chunk = sock.recv(size - len(buf))
        if not chunk:
            raise EOFError("the peer closed the connection")
        buf += chunk
    return json.loads(buf[:size].decode()), fds


# -- the daemon's side -----------------------------------------------------------------------------------

def handoff(timeout: float = READY_TIMEOUT) -> bool:
    """Called first thing by :func:`sparkdl_train.worker.daemon.main`: when a zygote of this executor
    serves this daemon, the zygote becomes the daemon and this process stays its stand-in until it ends
    (returns True then; the caller exits). False (and nothing changed) when there is no zygote, or it
    refuses, or the socket is not a zygote of this executor's; the reason goes to stderr, the executor's log."""
    if os.environ.get(ENV_SWITCH, "").strip().lower() == "off" or not sys.platform.startswith("linux"):
        return False
    started = time.monotonic()
    sock = _connect(os.getppid())
    if sock is None:
        return False  # no zygote for this JVM: the plugin is off, or it did not start
    # Spark's signals wait until this process knows whether it is a stand-in (then they go on to the daemon) or
    # the daemon itself (then they act as they always did)
    held = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    signal.pthread_sigmask(signal.SIG_BLOCK, held)
    pid = None
    try:
        pid = _ask(sock, timeout)
    finally:
        sock.close()
        if pid is not None:
            _forward_signals(pid)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, held)
    if pid is None:
        return False
    print(f"sparkdl_train daemon: running as pid {pid}, the executor's zygote with its imports done "
          f"(waited {time.monotonic() - started:.2f} s)", file=sys.stderr, flush=True)
    _stand_in(pid)
    return True


def _connect(owner: int, bind_timeout: float = BIND_TIMEOUT) -> socket.socket | None:
    """A connection to the zygote of JVM ``owner``; None when it has none. A zygote the JVM has started but whose
    socket is not bound yet (its interpreter still starting: Spark may start a daemon as soon as the executor
    registers) is waited for, up to ``bind_timeout`` seconds or until it ends or serves another daemon."""
    starting = None
    deadline = time.monotonic() + bind_timeout
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(socket_name(os.getuid(), owner))
            return sock
        except OSError:
            sock.close()
        if starting is None:
            starting = starting_zygote(owner)
        if starting is None or time.monotonic() >= deadline or not _is_starting_zygote(starting, owner):
            return None
        time.sleep(0.05)


def starting_zygote(owner: int) -> int | None:
    """A zygote of this user's that JVM ``owner`` started and that has not become a daemon (from /proc): one
    whose socket may not be bound yet. None when there is none."""
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return None
    return next((pid for pid in pids if _is_starting_zygote(pid, owner)), None)


def _is_starting_zygote(pid: int, owner: int) -> bool:
    if parent_of(pid) != owner:
        return False
    try:
        if os.stat(f"/proc/{pid}").st_uid != os.getuid():
            return False
        with open(f"/proc/{pid}/comm", "rb") as f:
            if f.read().strip() == DAEMON_NAME:
                return False  # it serves a daemon already
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"sparkdl_train.worker.zygote" in f.read().split(b"\0")
    except OSError:
        return False


def _name_self(name: bytes) -> None:
    """This process's name in ps and /proc/PID/comm (Linux; nothing elsewhere)."""
    try:
        with open("/proc/self/comm", "wb") as f:
            f.write(name)
    except OSError:
        pass


def _ask(sock: socket.socket, timeout: float) -> int | None:
    """The zygote's pid once it has taken this daemon's streams, None when it will not (said on stderr)."""
    try:
        peer, uid = _peer(sock)
        if uid != os.getuid() or parent_of(peer) != os.getppid():  # a socket squatted by another process: tell it nothing
            print(f"sparkdl_train daemon: the zygote's socket is held by pid {peer} (uid {uid}), not a child of this "
                  "executor's JVM; starting as usual", file=sys.stderr, flush=True)
            return None
        sock.settimeout(timeout)
        request = {"protocol": PROTOCOL, "state": _this_state(), "environ": dict(os.environ), "path": list(sys.path),
                   "cwd": os.getcwd()}
        _send(sock, request, [0, 1, 2])
        reply, _ = _recv(sock)
    except (OSError, EOFError, ValueError) as exc:
        print(f"sparkdl_train daemon: the executor's zygote did not answer ({type(exc).__name__}: {exc}); "
              "starting as usual", file=sys.stderr, flush=True)
        return None
    if not reply.get("pid"):
        print(f"sparkdl_train daemon: the executor's zygote cannot serve this daemon ({reply.get('refused')}); "
              "starting as usual", file=sys.stderr, flush=True)
        return None
    return int(reply["pid"])


def _forward_signals(pid: int) -> None:
    def forward(signum: int, _frame: Any) -> None:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, forward)


def _stand_in(pid: int) -> None:
    """Return once the daemon ``pid`` has ended (Spark's signals go on to it: :func:`_forward_signals`)."""
    for fd in (0, 1):  # the daemon holds Spark's pipes now; this process neither reads nor writes them
        try:
            os.close(fd)
        except OSError:
            pass
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = None
    while True:
        if pidfd is not None:
            try:
                if select.select([pidfd], [], [], 5.0)[0]:
                    return
            except InterruptedError:
                continue
        else:
            time.sleep(0.5)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        except PermissionError:
            pass


# -- the zygote ------------------------------------------------------------------------------------------

def _peer(conn: socket.socket) -> tuple[int, int]:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _gid = struct.unpack("3i", creds)
    return pid, uid


def parent_of(pid: int) -> int | None:
    """``pid``'s parent from /proc (None when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2:].split()[1])


def served_by() -> dict[str, Any] | None:
    """In a Python worker: the zygote its daemon is (``zygote`` and ``jvm`` pids, the zygote's ``imports_s``,
    the JVM's backend class ``jvm_main``), None when its daemon started as usual."""
    mark = os.environ.get(ENV_MARK, "").split()
    if len(mark) != 3:
        return None
    jvm = int(mark[1])
    return {"zygote": int(mark[0]), "jvm": jvm, "imports_s": float(mark[2]), "jvm_main": _backend_class(jvm)}


def _backend_class(pid: int) -> str | None:
    """The executor backend class JVM ``pid`` runs (``...CoarseGrainedExecutorBackend``), from /proc."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read().split(b"\0")
    except OSError:
        return None
    return next((a.decode() for a in args if a.endswith(b"ExecutorBackend")), None)


def _serve_one(conn: socket.socket, owner: int, state: dict[str, Any]) -> tuple[dict[str, Any], list[int]] | None:
    """Answer one connection: the request and its three descriptors when this process is to become its daemon
    (the reply is sent), None when it was refused or was not one of this executor's daemons."""
    pid, uid = _peer(conn)
    if uid != os.getuid() or parent_of(pid) != owner:
        conn.close()  # not a daemon of this executor: no answer at all
        return None
    conn.settimeout(30.0)
    fds: list[int] = []
    try:
        request, fds = _recv(conn, max_fds=3)
        if request.get("protocol") != PROTOCOL:
            why = f"protocol {request.get('protocol')!r}, this zygote speaks {PROTOCOL}"
        elif len(fds) != 3:
            why = f"{len(fds)} file descriptors sent, 3 expected"
        else:
            why = mismatch(state, request.get("state", {}))
        if why is not None:
            _send(conn, {"refused": why})
            return None
        _send(conn, {"pid": os.getpid()})
        taken, fds = fds, []
        return request, taken
    finally:
        for fd in fds:
            os.close(fd)
        conn.close()


def _become_daemon(request: dict[str, Any], fds: list[int], mark: str) -> None:
    """Take the daemon's streams, environment, path and folder, and run pyspark's daemon; never returns."""
    code = 1
    try:
        for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(s, signal.SIG_DFL)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.environ.clear()
        os.environ.update(request["environ"])
        os.environ[ENV_MARK] = mark
        sys.path[:] = request["path"]
        os.chdir(request["cwd"])
        from pyspark import daemon

        from .preload import environment_defaults

        environment_defaults()  # as the daemon's own preload would have set them
        daemon.manager()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 0
    except BaseException as exc:  # noqa: BLE001 - reported on the daemon's stderr, the executor's log
        print(f"sparkdl_train zygote's daemon failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
    finally:
        os._exit(code)


def serve(owner: int) -> None:
    """The zygote's life: bind, import, then become the daemon of the first of this executor's daemons whose
    imports would be its own (a later one, of another environment, starts as usual), or end when standard
    input closes (the executor stopped first)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(socket_name(os.getuid(), owner))
    except OSError as exc:
        print(f"sparkdl_train zygote: cannot bind its socket ({exc}); the executor's daemons start as usual",
              file=sys.stderr, flush=True)
        return
    listener.listen(16)  # daemons that ask while the imports run wait in the backlog
    started = time.monotonic()
    from . import code_cache
    from .preload import freeze_imports, preload

    state = _this_state()  # before the preload's defaults: a daemon's environment is compared as Spark gives it
    code_cache.install()
    failed = preload()
    import pyspark.daemon  # noqa: F401 - what it becomes

    freeze_imports()
    imports_s = time.monotonic() - started
    print(f"sparkdl_train zygote: imports done in {imports_s:.2f} s"
          + (f" (could not preload {', '.join(failed)})" if failed else ""), file=sys.stderr, flush=True)
    while True:
        ready = select.select([listener, 0], [], [])[0]
        if 0 in ready and not os.read(0, 4096):
            break  # the JVM closed our input: its executor has stopped
        if listener in ready:
            conn, _ = listener.accept()
            try:
                served = _serve_one(conn, owner, state)
            except (OSError, EOFError, ValueError) as exc:
                print(f"sparkdl_train zygote: a daemon's request failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
                continue
            if served is not None:
                _name_self(DAEMON_NAME)  # first: a daemon that finds the socket gone knows not to wait for it
                listener.close()  # any other daemon of this executor starts as usual
                _become_daemon(*served, f"{os.getpid()} {owner} {imports_s:.3f}")
    listener.close()


def main() -> None:
    owner = os.environ.get(ENV_OWNER, "")
    if not owner.isdigit():
        raise SystemExit(f"sparkdl_train zygote: {ENV_OWNER} must hold the executor JVM's pid, got {owner!r}")
    sys.stdout.flush()
    os.dup2(2, 1)  # nothing of the imports' output on a pipe nobody reads
    serve(int(owner))


if __name__ == "__main__":
    main()
