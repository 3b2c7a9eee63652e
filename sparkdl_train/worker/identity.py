"""Which executor a task runs in, found by the task itself.

The driver learns where tasks ran from Spark's status store (:mod:`sparkdl_train.driver.executors`),
which a Spark Connect client cannot reach. A Python worker can find it out itself: it is a child
(through Spark's worker daemon) of its executor's JVM, whose command line carries
``--executor-id <id>`` on every cluster manager (standalone, YARN, Kubernetes, local-cluster); a
JVM without one is a local-mode driver, whose tasks Spark records as executor ``"driver"``.
:func:`find_executor_id` uses only the standard library and ``/proc`` (Linux): the preflight's
probe ships its source to executors that may not have sparkdl_train.
"""

from __future__ import annotations


def find_executor_id(pid=None, depth=6):
    """The executor id of the JVM above process ``pid`` (default: this one), ``"driver"`` for a
    local-mode driver, ``None`` where ``/proc`` cannot tell (not Linux, another parent)."""
    import os

    pid = os.getppid() if pid is None else pid
    for _ in range(depth):
        try:
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                args = f.read().split(b"\0")
            with open("/proc/%d/stat" % pid, "rb") as f:
                parent = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return None
        if b"--executor-id" in args[:-1]:
            return args[args.index(b"--executor-id") + 1].decode("utf-8", "replace")
        if args and os.path.basename(args[0]) == b"java":
            return "driver"
        if parent <= 1:
            return None
        pid = parent
    return None


_found = []


def executor_id():
    """This process's executor id (:func:`find_executor_id`), looked up once per process."""
    if not _found:
        _found.append(find_executor_id())
    return _found[0]


def yarn_container():
    """The YARN container this process runs in and the NodeManager that launched it
    (``{"container": "container_..._000002", "nodemanager": "host:port"}``), from the environment
    every NodeManager gives its containers and Spark's executors pass on to their Python workers;
    ``{}`` off YARN."""
    import os

    container = os.environ.get("CONTAINER_ID")
    if not container:
        return {}
    host, port = os.environ.get("NM_HOST"), os.environ.get("NM_PORT")
    return {"container": container, "nodemanager": f"{host}:{port}" if host and port else None}
