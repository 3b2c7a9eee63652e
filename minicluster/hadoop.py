"""A YARN cluster with HDFS on this machine, for trying sparkdl_train on YARN (``./run yarn up``) and for
the tests (tests/cluster/test_yarn.py): Hadoop's MiniDFSCluster (NameNode, DataNode) and MiniYARNCluster
(ResourceManager, NodeManagers) in one JVM (minicluster/MiniHadoop.java), the classes Spark's own
YarnClusterSuite runs on.

What it needs is fetched on first use and cached (``$SDT_CACHE``, default ``~/.cache/sparkdl_train``): the
jars from Maven Central (``mvn``, minicluster/pom.xml, at the Hadoop version of the client pip's pyspark
ships), and MiniHadoop.java compiled against them (``javac``). The JVM starts with a minimal environment
(no virtualenv, no PYTHONPATH): containers it launches cannot import this checkout. It binds to loopback
with ports its daemons pick, writes the client configuration to ``<root>/conf/hadoop``
(``HADOOP_CONF_DIR``) and the cluster's Spark defaults to ``<root>/conf/spark`` (``SPARK_CONF_DIR``:
``spark.yarn.jars`` from the Spark installed on the nodes, as a cluster's administrator sets it), and is
stopped by its process group.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field

from .maven import JAVA_HINT, MissingTool, cached, copy_dependencies, daemon_alive, tool

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"  # small, short-lived JVMs: C1 only, the serial collector


def spark_home() -> str:
    import pyspark

    return os.path.dirname(os.path.abspath(pyspark.__file__))


def hadoop_version() -> str:
    """The Hadoop client version pip's pyspark ships: the mini cluster runs the same."""
    found = glob.glob(os.path.join(spark_home(), "jars", "hadoop-client-api-*.jar"))
    if not found:
        raise MissingTool(f"no hadoop-client-api jar in {spark_home()}/jars: this pyspark has no Hadoop client")
    return os.path.basename(found[0])[len("hadoop-client-api-"):-len(".jar")]


def artifacts() -> tuple[str, str]:
    """``(jars folder, classes folder)`` of the mini cluster: fetched with Maven and compiled with javac on
    first use, then taken from the cache (keyed by the Hadoop version, pom.xml and MiniHadoop.java)."""
    version = hadoop_version()

    def build(tmp: str) -> None:
        tool("java", JAVA_HINT)
        javac = tool("javac", JAVA_HINT)
        copy_dependencies("pom.xml", os.path.join(tmp, "jars"), f"hadoop-client-minicluster {version}", **{"hadoop.version": version})
        os.makedirs(os.path.join(tmp, "classes"))
        proc = subprocess.run([javac, "-nowarn", "-d", os.path.join(tmp, "classes"), "-cp", os.path.join(tmp, "jars", "*"),
                               os.path.join(HERE, "MiniHadoop.java")], capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"javac failed on minicluster/MiniHadoop.java:\n{proc.stdout}{proc.stderr}")
        shutil.copy(os.path.join(HERE, "log4j.properties"), os.path.join(tmp, "classes"))

    where = cached("minicluster-hadoop", version, ["pom.xml", "MiniHadoop.java", "log4j.properties"], build)
    return os.path.join(where, "jars"), os.path.join(where, "classes")


def processes_under(dirs: list[str]) -> list[int]:
    """The processes whose working directory is one of ``dirs`` or below (a container's processes)."""
    found = []
    for cwd in glob.glob("/proc/[0-9]*/cwd"):
        try:
            target = os.readlink(cwd)
        except OSError:
            continue
        if any(target == d or target.startswith(d.rstrip(os.sep) + os.sep) for d in dirs):
            found.append(int(cwd.split("/")[2]))
    return found


def node_env(root: str) -> dict[str, str]:
    """What the cluster's daemons (and so the containers they launch) see: Java, a system PATH, nothing of
    this checkout or its virtualenv."""
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": root, "LANG": "C.UTF-8"}
    if os.environ.get("JAVA_HOME"):
        env["JAVA_HOME"] = os.environ["JAVA_HOME"]
    return env


@dataclass
class MiniHadoop:
    """One NameNode and DataNode, a ResourceManager and ``nodemanagers`` NodeManagers of ``nm_memory_mb``,
    ``nm_vcores`` and ``nm_gpus`` (YARN's resource type ``yarn.io/gpu``, standing in for GPUs: nothing is
    isolated) each; ``settings`` are extra Hadoop/YARN properties."""

    root: str
    nodemanagers: int = 2
    nm_memory_mb: int = 4096
    nm_vcores: int = 4
    nm_gpus: int = 1
    settings: dict[str, str] = field(default_factory=dict)
    pid: int | None = None
    addresses: dict[str, str] = field(default_factory=dict)
    _proc: subprocess.Popen | None = None
    _seq: int = 0

    @property
    def hadoop_conf_dir(self) -> str:
        return os.path.join(self.root, "conf", "hadoop")

    @property
    def spark_conf_dir(self) -> str:
        return os.path.join(self.root, "conf", "spark")

    @property
    def log(self) -> str:
        return os.path.join(self.root, "minihadoop.log")

    @property
    def fs_uri(self) -> str:
        return self.addresses.get("fs.defaultFS", "")

    def env(self) -> dict[str, str]:
        """The client's environment: where spark-submit and Hadoop's clients find this cluster."""
        return {"HADOOP_CONF_DIR": self.hadoop_conf_dir, "SPARK_CONF_DIR": self.spark_conf_dir}

    def start(self, timeout: float = 240.0) -> MiniHadoop:
        jars, classes = artifacts()
        self.root = os.path.abspath(self.root)
        for name in ("conf", "control"):
            shutil.rmtree(os.path.join(self.root, name), ignore_errors=True)
        os.makedirs(self.root, exist_ok=True)
        args = [tool("java", JAVA_HINT), "-Xmx1536m", *JVM_OPTIONS.split(),
                f"-Dtest.build.data={os.path.join(self.root, 'yarn')}", f"-Djava.io.tmpdir={os.path.join(self.root, 'tmp')}",
                "-cp", f"{classes}:{os.path.join(jars, '*')}", "MiniHadoop", "--dir", self.root,
                "--nodemanagers", str(self.nodemanagers), "--nm-memory-mb", str(self.nm_memory_mb),
                "--nm-vcores", str(self.nm_vcores), "--nm-gpus", str(self.nm_gpus)]
        for key, value in self.settings.items():
            args += ["--set", f"{key}={value}"]
        os.makedirs(os.path.join(self.root, "tmp"), exist_ok=True)
        with open(self.log, "wb") as log:
            self._proc = subprocess.Popen(args, cwd=self.root, env=node_env(self.root), stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, start_new_session=True)
        self.pid = self._proc.pid
        deadline = time.monotonic() + timeout
        while True:
            with open(self.log, errors="replace") as f:
                text = f.read()
            if "\nREADY" in text or text.startswith("READY"):
                break
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the YARN mini cluster did not start (exit {self._proc.returncode}):\n{text[-4000:]}")
            time.sleep(0.2)
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key in ("fs.defaultFS", "yarn.resourcemanager.address", "yarn.resourcemanager.webapp.address"):
                self.addresses[key] = value
        self._write_spark_conf()
        self._save_state()
        return self

    def _write_spark_conf(self) -> None:
        """The cluster's Spark defaults, as its administrator would set them: Spark installed on every node
        (``spark.yarn.jars local:``: nothing uploaded or localized per application; here the nodes are this
        machine and the installation pyspark's) and small JVMs."""
        os.makedirs(self.spark_conf_dir, exist_ok=True)
        with open(os.path.join(self.spark_conf_dir, "spark-defaults.conf"), "w") as f:
            f.write("# written by minicluster/hadoop.py: this cluster's defaults (spark-submit --load-spark-defaults)\n"
                    f"spark.yarn.jars                     local:{os.path.join(spark_home(), 'jars')}/*\n"
                    f"spark.driver.defaultJavaOptions     {JVM_OPTIONS}\n"
                    f"spark.executor.defaultJavaOptions   {JVM_OPTIONS}\n"
                    f"spark.yarn.am.extraJavaOptions      {JVM_OPTIONS}\n")
        shutil.copy(os.path.join(ROOT, "conf", "log4j2.properties"), self.spark_conf_dir)

    def _save_state(self) -> None:
        with open(os.path.join(self.root, "state.json"), "w") as f:
            json.dump({"pid": self.pid, "addresses": self.addresses, "nodemanagers": self.nodemanagers}, f)

    @classmethod
    def attach(cls, root: str) -> MiniHadoop:
        """The cluster ``./run yarn up`` started under ``root`` (for ``down``, ``status``, commands)."""
        root = os.path.abspath(root)
        with open(os.path.join(root, "state.json")) as f:
            state = json.load(f)
        return cls(root=root, nodemanagers=state["nodemanagers"], pid=state["pid"], addresses=state["addresses"])

    def alive(self) -> bool:
        return daemon_alive(self.pid, b"MiniHadoop")

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the JVM and every container it launched (one process group), by pid."""
        if self.pid is None:
            return
        if self.alive() or (self._proc is not None and self._proc.poll() is None):
            try:
                os.killpg(self.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            deadline = time.monotonic() + timeout
            while self.alive() and time.monotonic() < deadline:
                time.sleep(0.2)
            if self.alive():
                try:
                    os.killpg(self.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                deadline = time.monotonic() + 10
                while self.alive() and time.monotonic() < deadline:  # reaped by whoever is its parent now
                    time.sleep(0.1)
        if self._proc is not None:
            self._proc.wait(timeout=timeout)
        # containers start sessions of their own (setsid): any left from this cluster's folder go too
        for pid in self.container_pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def container_pids(self) -> list[int]:
        """Processes running in this cluster's containers (their working directory is under its root)."""
        return processes_under([os.path.join(self.root, "yarn")])

    def _java(self, main: str, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess:
        """A Hadoop client command (``hdfs dfs``, ``yarn application``) from pyspark's Hadoop client jars."""
        cp = f"{self.hadoop_conf_dir}:{os.path.join(spark_home(), 'jars', '*')}"
        env = {**node_env(self.root), "HADOOP_CONF_DIR": self.hadoop_conf_dir}
        return subprocess.run([tool("java", JAVA_HINT), *JVM_OPTIONS.split(), "-cp", cp, main, *args],
                              capture_output=True, text=True, timeout=timeout, env=env)

    def hdfs(self, *args: str, check: bool = True, timeout: float = 300.0) -> str:
        """``hdfs dfs <args>`` against this cluster; returns its stdout."""
        proc = self._java("org.apache.hadoop.fs.FsShell", *args, timeout=timeout)
        if check and proc.returncode != 0:
            raise RuntimeError(f"hdfs dfs {' '.join(args)} failed:\n{proc.stderr[-3000:]}")
        return proc.stdout

    def yarn(self, *args: str, check: bool = True, timeout: float = 120.0) -> str:
        """``yarn <application|applicationattempt|container|node> ...`` against this cluster; returns stdout."""
        mains = {"application": "ApplicationCLI", "applicationattempt": "ApplicationCLI", "container": "ApplicationCLI",
                 "node": "NodeCLI"}
        if not args or args[0] not in mains:
            raise ValueError(f"yarn {' '.join(args)}: the commands here are {', '.join(mains)}")
        proc = self._java(f"org.apache.hadoop.yarn.client.cli.{mains[args[0]]}", *args, timeout=timeout)
        if check and proc.returncode != 0:
            raise RuntimeError(f"yarn {' '.join(args)} failed:\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}")
        return proc.stdout

    def command(self, line: str, timeout: float = 60.0) -> str:
        """One of MiniHadoop.java's control commands (``nodes``, ``stop-nm I``, ``node-resource I MB VCORES``)."""
        control = os.path.join(self.root, "control")
        self._seq += 1
        stem = os.path.join(control, f"{time.time_ns()}-{os.getpid()}-{self._seq}")
        with open(stem + ".tmp", "w") as f:
            f.write(line + "\n")
        os.rename(stem + ".tmp", stem + ".cmd")
        deadline = time.monotonic() + timeout
        while not os.path.exists(stem + ".done"):
            if not self.alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the mini cluster did not answer {line!r} (alive: {self.alive()})")
            time.sleep(0.1)
        with open(stem + ".out") as f:
            out = f.read()
        if out.startswith("error:"):
            raise RuntimeError(f"{line}: {out}")
        return out

    def nodes(self) -> list[dict]:
        """Each NodeManager: its index, node id (``host:port``), service state, the ResourceManager's view of it
        and its used and total memory (MB) and GPUs (resource type ``yarn.io/gpu``)."""
        rows = []
        for line in self.command("nodes").splitlines():
            index, node, service, state, used, total, gpus_used, gpus = line.split()
            rows.append({"index": int(index), "node": node, "service": service, "state": state,
                         "used_mb": int(used), "total_mb": int(total), "used_gpus": int(gpus_used), "gpus": int(gpus)})
        return rows
