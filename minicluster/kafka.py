"""A Kafka broker on this machine, for trying ``SparkModel.fit_stream`` on a real topic (``./run kafka up``) and
for the tests: one JVM in KRaft mode (the broker is its own controller: no ZooKeeper), bound where it is told
(``127.0.0.1`` by default) on ports it picks, its log folder under ``<root>/data``, stopped by its process group.

Its jars (``org.apache.kafka:kafka_2.13``) and Spark's Kafka source (``spark-sql-kafka-0-10_2.13`` and what it
needs beyond Spark's own jars) are fetched from Maven Central on first use and cached (minicluster/maven.py).
"""

from __future__ import annotations

import base64
import glob
import json
import logging
import os
import re
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass

from .hadoop import JVM_OPTIONS, node_env, spark_home
from .maven import JAVA_HINT, cache_root, cached, copy_dependencies, daemon_alive, tool

logger = logging.getLogger(__name__)

KAFKA_VERSION = "4.1.1"
# Spark's Kafka source at pyspark's own version when Maven Central serves it; else this one (on 2026-11-29 Maven
# Central had no spark-sql-kafka-0-10_2.13 4.3.0 for pip's pyspark 4.3.0; 4.2.0's source runs on it: the tests
# read a topic with it)
CONNECTOR_FALLBACK = "4.2.0"


def broker_jars() -> str:
    """The folder of the broker's jars (fetched on first use)."""
    def build(tmp: str) -> None:
        tool("java", JAVA_HINT)
        copy_dependencies("kafka-pom.xml", os.path.join(tmp, "jars"), f"Kafka {KAFKA_VERSION}", **{"kafka.version": KAFKA_VERSION})

    return os.path.join(cached("kafka-broker", KAFKA_VERSION, ["kafka-pom.xml"], build), "jars")


def _artifact(jar: str) -> str:
    """``kafka-clients-3.9.2.jar`` -> ``kafka-clients``."""
    return re.sub(r"-\d[\w.]*(-[A-Za-z]\w*)?\.jar$", "", os.path.basename(jar))


def connector_jars() -> list[str]:
    """The jars Spark's Kafka source needs beyond Spark's own (for ``spark.jars`` / ``--jars``), at pyspark's
    version or CONNECTOR_FALLBACK where Maven Central does not serve that one."""
    import pyspark

    spark_has = {_artifact(j) for j in glob.glob(os.path.join(spark_home(), "jars", "*.jar"))}

    def build_for(version: str):
        def build(tmp: str) -> None:
            copy_dependencies("spark-kafka-pom.xml", os.path.join(tmp, "jars"), f"spark-sql-kafka-0-10_2.13 {version}",
                              **{"spark.version": version})
            for jar in glob.glob(os.path.join(tmp, "jars", "*.jar")):
                if _artifact(jar) in spark_has:
                    os.remove(jar)
        return build

    version = pyspark.__version__
    refused = os.path.join(cache_root(), f"spark-kafka-{version}.refused")  # asked again a day later
    where = None
    if not (os.path.exists(refused) and time.time() - os.path.getmtime(refused) < 86400):
        try:
            where = cached("spark-kafka", version, ["spark-kafka-pom.xml"], build_for(version))
        except RuntimeError as exc:
            if version == CONNECTOR_FALLBACK:
                raise
            logger.warning("Maven Central serves no spark-sql-kafka-0-10_2.13 %s (%s); using %s", version,
                           str(exc).splitlines()[0], CONNECTOR_FALLBACK)
            with open(refused, "w") as f:
                f.write(str(exc)[-2000:])
    if where is None:
        where = cached("spark-kafka", CONNECTOR_FALLBACK, ["spark-kafka-pom.xml"], build_for(CONNECTOR_FALLBACK))
    return sorted(glob.glob(os.path.join(where, "jars", "*.jar")))


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass
class KafkaBroker:
    """One broker-and-controller under ``root``, listening on ``host:port`` (0: a free port), new topics with
    ``partitions`` partitions."""

    root: str
    host: str = "127.0.0.1"
    port: int = 0
    partitions: int = 2
    pid: int | None = None
    _proc: subprocess.Popen | None = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def log(self) -> str:
        return os.path.join(self.root, "kafka.log")

    def start(self, timeout: float = 120.0) -> KafkaBroker:
        jars = os.path.join(broker_jars(), "*")
        java = tool("java", JAVA_HINT)
        self.root = os.path.abspath(self.root)
        os.makedirs(self.root, exist_ok=True)
        self.port = self.port or _free_port(self.host)
        controller = _free_port(self.host)
        props = os.path.join(self.root, "server.properties")
        with open(props, "w") as f:
            f.write("# written by minicluster/kafka.py\n"
                    "process.roles=broker,controller\nnode.id=1\n"
                    f"controller.quorum.voters=1@{self.host}:{controller}\n"
                    f"listeners=PLAINTEXT://{self.host}:{self.port},CONTROLLER://{self.host}:{controller}\n"
                    f"advertised.listeners=PLAINTEXT://{self.host}:{self.port}\n"
                    "controller.listener.names=CONTROLLER\ninter.broker.listener.name=PLAINTEXT\n"
                    "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT\n"
                    f"log.dirs={os.path.join(self.root, 'data')}\nnum.partitions={self.partitions}\n"
                    "offsets.topic.replication.factor=1\ntransaction.state.log.replication.factor=1\n"
                    "transaction.state.log.min.isr=1\ngroup.initial.rebalance.delay.ms=0\n"
                    "auto.create.topics.enable=true\n")
        with open(os.path.join(self.root, "log4j2.properties"), "w") as f:
            f.write("rootLogger.level=INFO\nrootLogger.appenderRef.out.ref=out\nappender.out.type=Console\n"
                    "appender.out.name=out\nappender.out.layout.type=PatternLayout\n"
                    "appender.out.layout.pattern=%d{HH:mm:ss} %p %c{1}: %m%n\n")
        base = [java, "-Xmx512m", *JVM_OPTIONS.split(), f"-Dlog4j2.configurationFile={os.path.join(self.root, 'log4j2.properties')}",
                f"-Dkafka.logs.dir={self.root}", "-cp", jars]
        env = node_env(self.root)
        if not os.path.exists(os.path.join(self.root, "data", "meta.properties")):
            cluster_id = "-"
            while cluster_id.startswith("-"):  # one in 64 would be read as an option (Kafka's own ids skip those too)
                cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
            proc = subprocess.run([*base, "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", props],
                                  capture_output=True, text=True, timeout=120, env=env)
            if proc.returncode != 0:
                raise RuntimeError(f"Kafka could not format its storage under {self.root}:\n{(proc.stdout + proc.stderr)[-3000:]}")
        with open(self.log, "ab") as log:
            self._proc = subprocess.Popen([*base, "kafka.Kafka", props], cwd=self.root, env=env, stdout=log,
                                          stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        self.pid = self._proc.pid
        deadline = time.monotonic() + timeout
        while True:
            with open(self.log, errors="replace") as f:
                text = f.read()
            if "Kafka Server started" in text:
                break
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the Kafka broker did not start (exit {self._proc.returncode}):\n{text[-4000:]}")
            time.sleep(0.2)
        with open(os.path.join(self.root, "state.json"), "w") as f:
            json.dump({"pid": self.pid, "host": self.host, "port": self.port, "partitions": self.partitions}, f)
        return self

    @classmethod
    def attach(cls, root: str) -> KafkaBroker:
        """The broker ``./run kafka up`` started under ``root``."""
        root = os.path.abspath(root)
        with open(os.path.join(root, "state.json")) as f:
            state = json.load(f)
        return cls(root=root, **state)

    def alive(self) -> bool:
        return daemon_alive(self.pid, b"kafka.Kafka")

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the broker's JVM (its process group), by pid: SIGTERM, then SIGKILL after ``timeout``."""
        if self.pid is None:
            return
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
            if not self.alive():
                break
            try:
                os.killpg(self.pid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait
            while self.alive() and time.monotonic() < deadline:
                if self._proc is not None:
                    self._proc.poll()
                time.sleep(0.2)
        if self._proc is not None:
            self._proc.wait(timeout=timeout)


def _dir() -> str:
    from .hadoop import ROOT

    return os.path.abspath(os.environ.get("SDT_KAFKA_DIR") or os.path.join(ROOT, ".kafka"))


def main(argv: list[str]) -> int:
    """``./run kafka up|down|status|env|fetch`` and ``./run kafka generate [jobs/ctr_events.py flags]``.

    ``up`` prints the shell lines that point a job at the broker (``eval "$(./run kafka up)"``: KAFKA_BOOTSTRAP,
    and SPARK_KAFKA_JARS for ``spark-submit --jars``); the broker lives under ``$SDT_KAFKA_DIR`` (default ``.kafka``)."""
    import shlex
    import sys

    from .maven import MissingTool

    action, rest = (argv[0], argv[1:]) if argv else ("status", [])
    where = _dir()
    running = os.path.exists(os.path.join(where, "state.json")) and KafkaBroker.attach(where).alive()
    try:
        if action == "fetch":
            broker_jars()
            connector_jars()
            print(f"Kafka {KAFKA_VERSION} and Spark's Kafka source: cached under the sparkdl_train cache", file=sys.stderr)
            return 0
        if action == "up":
            if running:
                print(f"a Kafka broker is running already under {where}", file=sys.stderr)
            else:
                print(f"starting a Kafka broker under {where} (first use: Maven fetches its jars)...", file=sys.stderr)
                broker = KafkaBroker(where).start()
                print(f"Kafka {KAFKA_VERSION} at {broker.bootstrap}; pid {broker.pid}; stop it with ./run kafka down", file=sys.stderr)
            action, running = "env", True
        if action == "env":
            if not running:
                sys.exit(f"error: no Kafka broker running under {where}: ./run kafka up")
            print(f"export KAFKA_BOOTSTRAP={shlex.quote(KafkaBroker.attach(where).bootstrap)}")
            print(f"export SPARK_KAFKA_JARS={shlex.quote(','.join(connector_jars()))}")
            return 0
    except MissingTool as exc:
        sys.exit(f"error: {exc}")
    if action == "down":
        if os.path.exists(os.path.join(where, "state.json")):
            KafkaBroker.attach(where).stop()
        print(f"no Kafka broker running under {where}", file=sys.stderr)
        return 0
    if action == "status":
        print(f"Kafka broker under {where}: {'running at ' + KafkaBroker.attach(where).bootstrap if running else 'not running'}")
        return 0 if running else 1
    if action == "generate":
        if not running and "--kafka" not in rest:
            sys.exit(f"error: no Kafka broker running under {where} (./run kafka up) and no --kafka given")
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "jobs"))
        import ctr_events

        return ctr_events.main(rest if "--kafka" in rest else ["--kafka", KafkaBroker.attach(where).bootstrap, *rest])
    sys.exit(f"usage: ./run kafka up|down|status|env|fetch | ./run kafka generate [--topic T --rate N --rows N --drift-at N]; got {action!r}")


if __name__ == "__main__":
    import sys

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    sys.exit(main(sys.argv[1:]))
