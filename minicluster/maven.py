"""The Java tools the local clusters need and the cache their Maven artifacts live in.

Each cluster (the YARN + HDFS mini cluster, the Kafka broker) is built once per version and per content of its
source files into ``$SDT_CACHE`` (default ``~/.cache/sparkdl_train``): a fresh machine fetches on first use, later
runs reuse the folder; builds of other versions or sources are removed once a day old."""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
import subprocess
import time
from collections.abc import Callable

HERE = os.path.dirname(os.path.abspath(__file__))
JAVA_HINT = "a JDK 17+ is needed (Debian/Ubuntu: apt-get install openjdk-17-jdk-headless) or JAVA_HOME"


class MissingTool(RuntimeError):
    """Java, javac or Maven is missing (the message says which and how to get it)."""


def tool(name: str, hint: str) -> str:
    """The path of ``java``, ``javac`` (``$JAVA_HOME/bin`` first) or ``mvn``; MissingTool with ``hint`` if absent."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home and name in ("java", "javac") and os.access(os.path.join(java_home, "bin", name), os.X_OK):
        return os.path.join(java_home, "bin", name)
    path = shutil.which(name)
    if not path:
        raise MissingTool(f"{name} not found: {hint}")
    return path


def daemon_alive(pid: int | None, marker: bytes) -> bool:
    """Whether the cluster JVM ``pid`` runs: its command line holds ``marker`` (not another process that reused
    the pid) and it is not a zombie."""
    if pid is None:
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            alive = marker in f.read()
        with open(f"/proc/{pid}/stat", "rb") as f:
            return alive and f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def cache_root() -> str:
    return os.environ.get("SDT_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "sparkdl_train")


def cached(kind: str, version: str, sources: list[str], build: Callable[[str], None]) -> str:
    """The folder ``<cache>/<kind>-<version>-<digest of sources>``, made by ``build(tmp_folder)`` on first use
    (renamed into place only once complete: an interrupted build is started again, never half used)."""
    digest = hashlib.sha256()
    for name in sources:
        with open(os.path.join(HERE, name), "rb") as f:
            digest.update(f.read())
    cache = cache_root()
    where = os.path.join(cache, f"{kind}-{version}-{digest.hexdigest()[:12]}")
    if os.path.exists(os.path.join(where, "done")):
        return where
    tmp = where + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    try:
        build(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    with open(os.path.join(tmp, "done"), "w") as f:
        f.write(version + "\n")
    shutil.rmtree(where, ignore_errors=True)
    os.rename(tmp, where)
    for old in glob.glob(os.path.join(cache, f"{kind}-*")):
        if old != where and not old.endswith(".tmp") and time.time() - os.path.getmtime(old) > 86400:
            shutil.rmtree(old, ignore_errors=True)
    return where


def copy_dependencies(pom: str, dest: str, what: str, **properties: str) -> None:
    """``mvn dependency:copy-dependencies`` of ``pom`` (a file in minicluster/) into ``dest``; ``what`` names the
    artifacts in the error when Maven cannot fetch them."""
    mvn = tool("mvn", f"{what} come from Maven Central on first use: install Maven (Debian/Ubuntu: apt-get install maven)")
    args = [mvn, "-q", "-B", "-f", os.path.join(HERE, pom), *(f"-D{k}={v}" for k, v in properties.items()),
            "dependency:copy-dependencies", "-DincludeScope=runtime", f"-DoutputDirectory={dest}"]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"Maven could not fetch {what}:\n{(proc.stdout + proc.stderr)[-4000:]}")
