"""The project on YARN with HDFS: README.md's YARN lines run as written against the mini cluster they start
(`./run yarn up`: a ResourceManager, two NodeManagers, a NameNode and a DataNode; minicluster/), every engine
on it, the ApplicationMaster lost in cluster mode and the application killed under a running fit.

The cluster's daemons and containers get a minimal environment (no virtualenv, no PYTHONPATH): the executors
and a cluster-mode driver run ./environment/bin/python from the `./run pack` archive, localized from HDFS.
Every test asserts where the tasks ran: YARN container ids on both NodeManagers, never the driver."""

import atexit
import datetime
import glob
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest
import readme
from helpers import ROOT, SCRIPTS

from minicluster.hadoop import MiniHadoop, processes_under

RUN = os.path.join(ROOT, "run")
# tests/scripts/yarn_jobs.py's own imports (tests/support/jobfiles.py). Never the checkout's root: YARN's client passes
# PYTHONPATH on to the containers, whose executors would then import sparkdl_train from the checkout
DRIVER_PATH = os.path.join(ROOT, "tests", "support")
ROWS = 100_000  # the README's cluster-mode line generates as many rows (seed 42) as the test writes for the others


class Yarn:
    def __init__(self, cluster: MiniHadoop, env: dict):
        self.cluster, self.env = cluster, env

    def run(self, command: str, timeout: float = 1200, **env) -> subprocess.CompletedProcess:
        """A command (a README line: its ./run made absolute) in a new user's shell pointed at this cluster, from
        the checkout (the README's relative paths)."""
        if command.startswith("./run "):
            command = readme.substitute(command, {"./run ": RUN + " "})
        return readme.run(command, ROOT, timeout=timeout, SPARK_LOCAL_IP="127.0.0.1", **self.env, **env)

    def summary(self, path: str) -> dict:
        return json.loads(self.cluster.hdfs("-cat", path))

    def nodemanagers(self) -> set[str]:
        return {n["node"] for n in self.cluster.nodes()}


def yarn_lines() -> dict[str, str]:
    lines = readme.commands("YARN")
    return {"up": next(c for c in lines if "./run yarn up" in c), "put": next(c for c in lines if c.startswith("./run hdfs dfs -put")),
            "client": next(c for c in lines if c.startswith("./run submit") and "--deploy-mode cluster" not in c),
            "cluster": next(c for c in lines if c.startswith("./run submit") and "--deploy-mode cluster" in c)}


@pytest.fixture(scope="module")
def yarn(tmp_path_factory, env_archive, spark):
    """README's `eval "$(./run yarn up)"` under a scratch SDT_YARN_DIR, then its `./run hdfs dfs -put` of the archive
    (from the folder the README's pack line wrote it to) and the CTR data the client-mode line reads; the
    cluster is stopped by pid at the end, whatever happens."""
    from sparkdl_train.datasets import ctr

    where = tmp_path_factory.mktemp("yarn")
    env = {"SDT_YARN_DIR": str(where / "cluster")}
    lines = yarn_lines()
    try:
        proc = readme.run(readme.substitute(lines["up"], {"./run ": RUN + " "}) + ' && echo "HADOOP_CONF_DIR=$HADOOP_CONF_DIR"'
                          ' && echo "SPARK_CONF_DIR=$SPARK_CONF_DIR"', str(where), timeout=900, **env)
    finally:
        if os.path.exists(where / "cluster" / "state.json"):
            atexit.register(MiniHadoop.attach(str(where / "cluster")).stop)
    for line in proc.stdout.splitlines():
        key, _, value = line.partition("=")
        if key in ("HADOOP_CONF_DIR", "SPARK_CONF_DIR") and value:
            env[key] = value
    cluster = MiniHadoop.attach(str(where / "cluster"))
    try:
        assert env["HADOOP_CONF_DIR"] == cluster.hadoop_conf_dir and env["SPARK_CONF_DIR"] == cluster.spark_conf_dir, env
        assert len(cluster.nodes()) == 2 and {n["state"] for n in cluster.nodes()} == {"RUNNING"}, cluster.nodes()
        readme.run(readme.substitute(lines["put"], {"./run ": RUN + " "}), os.path.dirname(env_archive), timeout=600, **env)
        ctr.write(spark, ctr.CTRSpec(rows=ROWS, seed=42), cluster.fs_uri + "/data/ctr")
        yield Yarn(cluster, env)
    finally:
        cluster.stop()
        assert not cluster.alive() and not cluster.container_pids()


def assert_ran_in_containers(s: dict, yarn: Yarn, workers: int = 2) -> None:
    """The training tasks ran in YARN containers of this application on both NodeManagers, from the shipped
    archive unpacked by the NodeManagers, never in the driver's process or the checkout."""
    assert s["master"] == "yarn", s["master"]
    app = s["application_id"].split("_", 1)[1]
    assert len(s["containers"]) >= workers and all(c.startswith(f"container_{app}_") for c in s["containers"]), s["containers"]
    assert len(s["nodemanagers"]) == 2 and set(s["nodemanagers"]) <= yarn.nodemanagers(), (s["nodemanagers"], yarn.nodemanagers())
    assert "driver" not in s["executor_ids"] and s["driver_pid"] not in s["worker_pids"], s
    assert s["driver_container"] not in s["containers"]
    for _, python, module in s["executor_environment"]:
        assert python.endswith("/environment/bin/python") and python.startswith(yarn.cluster.root), python
        assert "/environment/lib/" in module and not module.startswith(ROOT + "/sparkdl_train"), module
    for _, pyspark_file, folder, hits, misses in s["executor_code_cache"]:
        # pyspark from the pyspark.zip YARN localized for the application; its code through the host's store
        assert pyspark_file.startswith(yarn.cluster.root) and "/pyspark.zip/" in pyspark_file, pyspark_file
        assert folder is not None and hits + misses > 50, (folder, hits, misses)


@pytest.fixture(scope="module")
def client_run(yarn):
    """README's client-mode line: the driver here, Parquet from HDFS, the model and summary to HDFS (with the
    executor plugin ./run submit adds)."""
    proc = yarn.run(yarn_lines()["client"])
    assert "test AUC" in proc.stdout, proc.stdout[-3000:]
    return yarn.summary("/user/me/ctr/summary.json")


def test_readme_client_mode_line_trains_in_yarn_containers_from_hdfs(yarn, client_run):
    s = client_run
    assert s["deploy_mode"] == "client" and s["driver_container"] is None
    assert_ran_in_containers(s, yarn)
    assert s["mode"] == "asynchronous" and s["workers"] == 2 and s["train_rows"] + s["test_rows"] == ROWS, s
    assert s["data"] == "hdfs:///data/ctr" and s["data_format"] == "parquet"
    assert s["bayes_auc"] - 0.06 < s["test_auc"] <= s["bayes_auc"] + 0.005, (s["test_auc"], s["bayes_auc"])
    assert s["model_path"] == "hdfs:///user/me/ctr/ctr_model.keras"
    assert "ctr_model.keras" in yarn.cluster.hdfs("-ls", "/user/me/ctr")


def test_the_executor_plugin_starts_each_containers_python_imports_as_it_starts(client_run):
    """Every Python worker the client-mode line's executors checked runs under the daemon its container's executor
    JVM started with the plugin (YARN localized the plugin's jar; the archive's interpreter ran it), one per
    executor."""
    zygotes = client_run["executor_zygotes"]
    assert zygotes, client_run
    for executor, _host, zygote, jvm, main in zygotes:
        assert zygote is not None and main == "org.apache.spark.executor.YarnCoarseGrainedExecutorBackend", zygotes
    assert len({jvm for *_, jvm, _ in zygotes}) == len({e for e, *_ in zygotes}) == 2, zygotes


def gpu_conf() -> str:
    """The GPU lines of conf/spark-defaults.yarn.conf, uncommented, with the mini cluster's stand-in discovery
    script shipped with --files (its NodeManagers offer one yarn.io/gpu each and have no GPU)."""
    lines = [ln.lstrip("# ").split() for ln in open(os.path.join(ROOT, "conf", "spark-defaults.yarn.conf"))
             if re.match(r"#\s*spark\.(executor|task)\.resource\.gpu\.", ln)]
    settings = {k: v for k, v, *_ in lines}
    assert set(settings) == {"spark.executor.resource.gpu.amount", "spark.task.resource.gpu.amount",
                             "spark.executor.resource.gpu.discoveryScript"}, settings
    settings["spark.executor.resource.gpu.discoveryScript"] = "./gpu_discovery.sh"
    return "--files minicluster/gpu_discovery.sh " + " ".join(f"--conf {k}={v}" for k, v in settings.items())


def test_every_engine_trains_in_yarn_containers_on_yarn_gpus(yarn, client_run, tmp_path):
    """tests/scripts/yarn_jobs.py engines: the flagship job once per engine in one application submitted with
    conf/spark-defaults.yarn.conf and its GPU lines, each near the Bayes-optimal AUC, each in containers on
    both NodeManagers. GPUs as YARN schedules them: each executor asks for one yarn.io/gpu and each
    NodeManager has one, so YARN grants one executor per node and counts its GPU as used while it runs; every
    training task was given the GPU address the executor's discovery script reported (it trains on the CPU:
    the machine has none)."""
    out = tmp_path / "engines"
    cmd = (f"{RUN} submit --load-spark-defaults --properties-file conf/spark-defaults.yarn.conf {gpu_conf()} "
           f"{SCRIPTS}/yarn_jobs.py engines --data hdfs:///data/ctr --output {out}")
    used, done = {}, threading.Event()

    def watch():  # the ResourceManager's view of each node's GPUs while the application runs
        while not done.wait(2):
            try:
                for n in yarn.cluster.nodes():
                    used[n["node"]] = max(used.get(n["node"], 0), n["used_gpus"])
            except RuntimeError:
                pass

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yarn.run(cmd, PYTHONPATH=DRIVER_PATH)  # the driver's own imports; not the executors'
    finally:
        done.set()
        watcher.join()
    assert used == {n: 1 for n in yarn.nodemanagers()}, used
    import yarn_jobs

    for name, _ in yarn_jobs.ENGINES:
        with open(out / name / "summary.json") as f:
            s = json.load(f)
        assert_ran_in_containers(s, yarn)
        assert s["gpu_addresses"] == ["0"] and s["gpu_tasks"] == s["tasks"] > 0, (name, s["gpu_addresses"], s["gpu_tasks"])
        assert s["workers"] == 2 and s["epochs"] == 2, (name, s["workers"], s["epochs"])
        assert s["bayes_auc"] - 0.06 < s["test_auc"] <= s["bayes_auc"] + 0.005, (name, s["test_auc"], s["bayes_auc"])
        # client_run's application filled each host's store of pyspark's compiled code: this application's daemons,
        # with pyspark.zip localized at paths of its own, compiled none of it
        assert all(misses == 0 and hits > 50 for *_, hits, misses in s["executor_code_cache"]), s["executor_code_cache"]
        assert not {c[1] for c in s["executor_code_cache"]} & {c[1] for c in client_run["executor_code_cache"]}
    engines = {name: json.load(open(out / name / "summary.json"))["communication"]["engine"] for name, _ in yarn_jobs.ENGINES}
    assert engines == {"averaging": "spark_averaging", "synchronous_ps": "parameter_server", "hogwild": "parameter_server",
                       "allreduce_ring": "allreduce", "allreduce_batch": "allreduce"}, engines


def _container_dirs(yarn: Yarn, container: str) -> list[str]:
    """The folders of a container (a glob pattern): its working directory and its log directory."""
    # <root>/yarn/yarn/yarn-*/yarn-localDir-nm-*/usercache/<user>/appcache/<application>/<container>, and
    # <root>/yarn/yarn/yarn-*/yarn-logDir-nm-*/<application>/<container>
    return glob.glob(os.path.join(yarn.cluster.root, "yarn", *["*"] * 7, container)) + \
        glob.glob(os.path.join(yarn.cluster.root, "yarn", *["*"] * 4, container))


def test_cluster_mode_line_resumes_from_its_hdfs_checkpoint_when_the_application_master_is_lost(yarn, client_run, tmp_path):
    """README's cluster-mode line: the driver in the ApplicationMaster's container. Its processes are killed
    once it logs the second epoch (the first epoch's checkpoint is written before the second starts); YARN
    starts a second attempt (spark.yarn.maxAppAttempts 2 in conf/spark-defaults.yarn.conf), which resumes
    from the checkpoint on HDFS (--resume) and ends as good as the uninterrupted client-mode run."""
    command = readme.substitute(yarn_lines()["cluster"], {"./run ": RUN + " "})
    env = readme.clean_env(SPARK_LOCAL_IP="127.0.0.1", PYTHONUNBUFFERED="1", **yarn.env)
    before = set(_container_dirs(yarn, "container_*_01_000001"))
    log = tmp_path / "submit.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(["bash", "-c", command], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    killed = None
    try:
        deadline = time.monotonic() + 900
        while killed is None and proc.poll() is None and time.monotonic() < deadline:
            for am in set(_container_dirs(yarn, "container_*_01_000001")) - before:  # this application's first attempt
                stdout = os.path.join(am, "stdout")  # the driver's Python logs, through the ApplicationMaster's stdout
                if "logDir" in am and os.path.exists(stdout) and re.search(r"epoch 2/\d+ loss", open(stdout, errors="replace").read()):
                    container = os.path.basename(am)
                    pids = processes_under([d for d in _container_dirs(yarn, container) if "appcache" in d])
                    for pid in pids:
                        try:
                            os.kill(pid, signal.SIGKILL)
                        except ProcessLookupError:
                            pass
                    killed = {"container": container, "pids": pids}
            time.sleep(0.2)
        assert killed and killed["pids"], f"no ApplicationMaster logged its second epoch:\n{log.read_text()[-4000:]}"
        proc.wait(timeout=1200)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, log.read_text()[-6000:]
    s = yarn.summary("/user/me/ctr_cluster/summary.json")
    assert s["deploy_mode"] == "cluster" and s["driver_container"].endswith("_02_000001"), s["driver_container"]  # the second attempt
    assert_ran_in_containers(s, yarn)
    assert s["resumed_from_epoch"] is not None and s["resumed_from_epoch"] >= 1, s["resumed_from_epoch"]
    # the second attempt trained the epochs after the checkpoint: 4 in all
    assert s["epochs"] == len(s["epoch_samples"]) == 4 - s["resumed_from_epoch"], s
    assert s["data"].startswith("hdfs:///user/me/ctr_cluster/ctr_data_") and s["train_rows"] + s["test_rows"] == ROWS
    assert s["test_auc"] >= client_run["test_auc"] - 0.01 and s["test_auc"] > s["bayes_auc"] - 0.05, (s["test_auc"], client_run["test_auc"])


def _yarn_jobs(yarn: Yarn, args: str, on_line, timeout: float = 900, conf: str = "") -> tuple[int, str]:
    """tests/scripts/yarn_jobs.py submitted in client mode with conf/spark-defaults.yarn.conf (and ``conf``: more
    --conf options); ``on_line(line, app)`` sees each line of its output as it comes (``app``: the application id
    once the script printed it). Returns its exit status and output."""
    cmd = (f"{RUN} submit --load-spark-defaults --properties-file conf/spark-defaults.yarn.conf {conf} "
           f"{SCRIPTS}/yarn_jobs.py {args}")
    env = readme.clean_env(SPARK_LOCAL_IP="127.0.0.1", PYTHONUNBUFFERED="1", PYTHONPATH=DRIVER_PATH, **yarn.env)
    proc = subprocess.Popen(["bash", "-c", cmd], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    app, lines = None, []
    try:
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("APPLICATION "):
                app = line.split()[1]
            if app:
                on_line(line, app)
        proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, "".join(lines)


def test_an_application_killed_with_yarn_application_kill_ends_the_fit_in_bounded_time(yarn, tmp_path):
    """`./run yarn application -kill ID` under a running asynchronous fit (tests/scripts/yarn_jobs.py killed, a
    driver that outlives its fit as a notebook's does): the fit fails within seconds with a message, and the
    fit's servers are gone: no thread of theirs, no port left listening."""
    out = tmp_path / "killed"
    kill_at = []

    def kill(line, app):
        if not kill_at and line.startswith("Epoch 2/200"):
            yarn.cluster.yarn("application", "-kill", app)
            kill_at.append(time.time())

    _, text = _yarn_jobs(yarn, f"killed --data hdfs:///data/ctr --epochs 200 --output {out}", kill, timeout=600)
    assert kill_at, text[-4000:]
    kill_at, app = kill_at[0], re.search(r"APPLICATION (\S+)", text).group(1)
    with open(out / "killed.json") as f:
        k = json.load(f)
    assert k["application_id"] == app and k["error"], k
    assert "unpersist" not in k["error"], k["error"]  # the fit's own error, not its cleanup's on a stopped context
    assert 1 <= k["epochs_done"] < 200, k["epochs_done"]
    assert k["failed_at"] - kill_at < 60, k["failed_at"] - kill_at
    assert k["ports_left"] == [], k
    assert not [t for t in k["threads_left"] if "sparkdl" in t.lower() or "server" in t.lower()], k["threads_left"]
    print(json.dumps({key: k[key] for key in ("error", "threads_left", "ports_left")}, indent=1), file=sys.stderr)


def test_a_container_killed_for_its_memory_ends_the_fit_at_once_naming_the_setting(yarn, tmp_path):
    """Containers too small for the fit's TensorFlow (spark.executor.memory 512m + memoryOverhead 1024m, and a
    model with a 4M-row embedding table): the NodeManager's memory check kills an executor's container during
    the first epoch (minicluster/MiniHadoop.java keeps YARN's container monitor on). Spark would retry on new
    containers, each killed in turn, and fail minutes later on the lost shuffle output; the fit ends within
    seconds of the first kill (the NodeManager's log says when) with cause container_memory and YARN's line
    naming spark.executor.memoryOverhead."""
    out = tmp_path / "memory"
    conf = ("--conf spark.executor.memory=512m --conf spark.executor.memoryOverhead=1024m --conf spark.task.maxFailures=2 "
            "--conf spark.yarn.max.executor.failures=20")
    code, text = _yarn_jobs(yarn, f"memory --data hdfs:///data/ctr --epochs 3 --output {out}", lambda line, app: None,
                            timeout=600, conf=conf)
    assert code == 0, text[-6000:]
    with open(out / "memory.json") as f:
        m = json.load(f)
    assert m["stage"] == "fit" and m["error_type"] == "WorkerError" and m["cause"] == "container_memory", m
    assert "container was killed for its memory" in m["error"] and "exceeding physical memory limits" in m["error"], m["error"]
    assert "spark.executor.memoryOverhead" in m["error"].splitlines()[0], m["error"]
    # the NodeManager's own line for each container it killed ("12:52:39 WARN ContainersMonitorImpl: Container
    # [pid=...,containerID=container_<app>_01_000002] is running ... beyond the 'PHYSICAL' memory limit")
    app = m["application_id"].split("_", 1)[1]
    kills = [ln[:8] for ln in open(yarn.cluster.log, errors="replace")
             if f"containerID=container_{app}_" in ln and "beyond the 'PHYSICAL' memory limit" in ln]
    assert kills, "the NodeManager killed no container of this application"
    first = datetime.datetime.combine(datetime.date.fromtimestamp(m["failed_at"]), datetime.time.fromisoformat(kills[0]))
    # the fit ended within seconds of the first kill (Spark's own retries went on for over 3 minutes here)
    assert 0 <= m["failed_at"] - first.timestamp() < 45, (kills, m["failed_at"], first)
    assert "State : FINISHED" in yarn.cluster.yarn("application", "-status", m["application_id"])


_COUNT = re.compile(r"(\d+(?:\.\d+)?)([kMG]?)(?:sample|/)")


def _samples(bar_text: str) -> float | None:
    """The samples a tqdm bar's text shows ("Epoch 1/2: 45.2k/90.0k [...]" or "...: 12.3ksample [...]")."""
    m = _COUNT.search(bar_text.split(":", 1)[-1])
    return float(m.group(1)) * {"": 1, "k": 1e3, "M": 1e6, "G": 1e9}[m.group(2)] if m else None


def test_the_yarn_notebook_runs_in_jupyterlab_as_a_person_sees_it(yarn, tmp_path):
    """notebooks/yarn.ipynb opened in JupyterLab in headless Chromium (tests/support/notebook_browser.py), every
    cell run from the Run menu by a real kernel, the driver of a client-mode application on the cluster: its
    settings check shows conf/spark-defaults.yarn.conf all ok, the fit's progress bar is seen moving while the
    fit runs (screenshots kept in test-artifacts/), and the training ran in YARN containers on both
    NodeManagers near the Bayes-optimal AUC. The server and its kernel are stopped by pid; the application
    ends when the notebook stops its session."""
    from notebook_browser import Browser, JupyterLab, artifacts_dir, copy_notebook, run_all_cells

    copy_notebook(os.path.join(ROOT, "notebooks", "yarn.ipynb"), str(tmp_path / "notebooks"))
    env = readme.clean_env(SPARK_LOCAL_IP="127.0.0.1", YARN_SETTINGS=os.path.join(ROOT, "conf", "spark-defaults.yarn.conf"),
                           YARN_DATA="hdfs:///data/ctr", YARN_EPOCHS="3", **yarn.env)
    lab = JupyterLab(str(tmp_path), str(tmp_path / "lab"), env).start()
    shots, seen, browser = artifacts_dir(ROOT), {}, None

    def watch(seconds, cells):  # a screenshot the first time a bar is seen part way
        moving = [b for c in cells for b in c["bars"] if b["width"] not in ("", "0%", "100%") and _samples(b["text"])]
        if moving and "fit" not in seen:
            seen["fit"] = browser.screenshot(os.path.join(shots, "jupyter_yarn_fit.png"))

    try:
        browser = Browser(str(tmp_path / "chromium"))
        cells, snapshots = run_all_cells(browser, lab, "notebooks/yarn.ipynb", timeout=900, on_snapshot=watch)
        done = browser.screenshot(os.path.join(shots, "jupyter_yarn_done.png"))
    finally:
        if browser is not None:
            browser.quit()
        killed = lab.stop()
    text = "\n".join(c["output"] for c in cells)
    prompts = [c["prompt"] for c in cells if c["code"]]
    assert all(p not in ("", "[ ]:") for p in prompts), f"not every cell ran: {prompts}\n{text[-6000:]}"
    (line,) = [ln for ln in text.splitlines() if ln.startswith("RESULTS ")] or [None]
    assert line, f"no RESULTS line:\n{text[-6000:]}"
    r = json.loads(line[len("RESULTS "):].strip())
    assert set(r["settings"].values()) == {"ok"}, r["settings"]
    app = r["application_id"].split("_", 1)[1]
    assert len(r["containers"]) >= 2 and all(c.startswith(f"container_{app}_") for c in r["containers"]), r
    assert len(r["nodemanagers"]) == 2 and set(r["nodemanagers"]) <= yarn.nodemanagers(), r
    assert "driver" not in r["executor_ids"] and r["epochs"] == 3, r
    assert r["bayes_auc"] - 0.06 < r["test_auc"] <= r["bayes_auc"] + 0.005, r
    # the person's view: the fit's bar moved while its cell ran, epoch by epoch, with both workers reporting
    fit_index = next(i for i, c in enumerate(cells) if c["bars"])
    states: dict[int, list[float]] = {}  # each epoch's bar: the sample counts it showed while the fit's cell ran
    for _, snap in snapshots:
        if snap[fit_index]["prompt"] != "[*]:":
            continue
        for j, bar in enumerate(snap[fit_index]["bars"]):
            n = _samples(bar["text"])
            if n is not None and (not states.get(j) or states[j][-1] != n):
                states.setdefault(j, []).append(n)
    assert len(states) == 3 and any(len(v) >= 3 and v == sorted(v) for v in states.values()), states
    assert any("workers=2/2" in b["text"] for _, snap in snapshots for b in snap[fit_index]["bars"]), snapshots[-1]
    for shot in (seen.get("fit"), done):
        assert shot and open(shot, "rb").read(8) == b"\x89PNG\r\n\x1a\n" and os.path.getsize(shot) > 20_000, shot
    assert "State : FINISHED" in yarn.cluster.yarn("application", "-status", r["application_id"])
    assert killed == [], killed  # the kernel ended with the server


DYNAMIC_ALLOCATION = {  # one executor to start with, two at most; idle ones (nothing cached, no live shuffle) released
    "spark.dynamicAllocation.enabled": "true", "spark.dynamicAllocation.shuffleTracking.enabled": "true",
    "spark.dynamicAllocation.shuffleTracking.timeout": "5s", "spark.executor.instances": "1",
    "spark.dynamicAllocation.minExecutors": "1", "spark.dynamicAllocation.initialExecutors": "1",
    "spark.dynamicAllocation.maxExecutors": "2", "spark.dynamicAllocation.executorIdleTimeout": "20s",
    "spark.dynamicAllocation.schedulerBacklogTimeout": "1s", "spark.dynamicAllocation.sustainedSchedulerBacklogTimeout": "1s",
}


def test_fits_under_dynamic_allocation_use_the_executors_that_come_and_go_and_allreduce_is_refused(yarn, tmp_path):
    """Dynamic allocation on YARN (tests/scripts/yarn_jobs.py elastic): an asynchronous fit of four workers starts on
    the one executor the application has; Spark adds a second while the tasks wait, and the fit's tasks run on it;
    during a slow step after the second epoch an idle executor is released and the fit goes on without it, then
    uses the one Spark adds next. Every epoch trains every row, sm.stats records each epoch's executors, the
    averaging fit after it trains on the executors there, and an allreduce fit is refused at once, naming the
    setting (barrier stages need their slots fixed: SPARK-24954)."""
    out = tmp_path / "elastic"
    conf = " ".join(f"--conf {k}={v}" for k, v in DYNAMIC_ALLOCATION.items())
    code, text = _yarn_jobs(yarn, f"elastic --data hdfs:///data/ctr --output {out}", lambda line, app: None, conf=conf)
    assert code == 0, text[-6000:]
    with open(out / "elastic.json") as f:
        r = json.load(f)
    executors, fit = r["executors"], r["fits"]["asynchronous"]
    epochs = fit["epochs"]
    assert len(r["before_fit"]) == 1 and len(epochs) == 4, r
    assert all(e["samples"] == r["train_rows"] for e in epochs), epochs  # nothing lost or trained twice
    arrived = {k for k, v in executors.items() if v["added"] > fit["started"]}
    assert arrived & set(epochs[0]["executors"] + epochs[1]["executors"]), (arrived, epochs)  # came, and was used
    # released while the driver's slow step ran after the second epoch (others may go idle after the fit, as
    # the evaluation runs: those are not the point)
    released = set(r.get("released_in_step", ()))
    assert released and all("killed by driver" in executors[k]["reason"] for k in released), (r.get("released_in_step"), executors)
    later = set(epochs[2]["executors"] + epochs[3]["executors"])
    assert not released & later, (released, epochs[2:])  # the fit went on without it
    assert len({x for e in epochs for x in e["executors"]}) >= 2 and fit["auc"] > 0.83, fit
    averaging = r["fits"]["averaging"]
    assert all(e["samples"] == r["train_rows"] and e["executors"] for e in averaging["epochs"]), averaging
    assert r["allreduce"]["error"].startswith("mode='allreduce' runs as a Spark barrier stage"), r["allreduce"]
    assert "spark.dynamicAllocation.enabled=true" in r["allreduce"]["error"] and r["allreduce"]["seconds"] < 30, r["allreduce"]


@pytest.fixture(scope="module")
def late_then_lost_node(yarn, tmp_path_factory):
    """tests/scripts/yarn_jobs.py late, then its lost-node fit, in one application (last in this module: the node
    stays lost). Submitted while one NodeManager has no room (its resources set to 0 MB, as when other
    applications fill its queue), given back when the job says it starts its next fit; in the second epoch of the
    lost-node fit, the NodeManager of one executor (not the ApplicationMaster's) is stopped."""
    out = tmp_path_factory.mktemp("late")
    nodes = {n["index"]: n for n in yarn.cluster.nodes()}
    full = max(nodes)  # the AM and the first executor go to the other node
    seen = {"restored": None, "lost": None, "resources": None}

    def on_line(line, app):
        if seen["restored"] is None and line.startswith("LATE WAITING"):
            yarn.cluster.command(f"node-resource {full} {nodes[full]['total_mb']} 4")
            seen["restored"] = time.monotonic()
        if seen["resources"] is None and line.startswith("LOST NODE FIT"):
            seen["resources"] = {n["node"]: n["total_mb"] for n in yarn.cluster.nodes()}
        if seen["lost"] is None and seen["resources"] is not None and line.startswith("Epoch 2/4"):
            (am_log,) = [d for d in _container_dirs(yarn, f"container_{app.split('_', 1)[1]}_01_000001") if "logDir" in d]
            am_index = int(re.search(r"yarn-logDir-nm-(\d+)_", am_log).group(1))
            victim = next(i for i in nodes if i != am_index)
            yarn.cluster.command(f"stop-nm {victim}")
            seen["lost"] = nodes[victim]["node"]

    yarn.cluster.command(f"node-resource {full} 0 0")
    try:
        conf = "--conf spark.sparkdl_train.executors.registrationTimeout=10 --conf spark.sparkdl_train.ps.connectTimeout=30"
        code, text = _yarn_jobs(yarn, f"late --data hdfs:///data/ctr --epochs 2 --lost-node-epochs 4 --output {out}", on_line,
                                conf=conf)
    finally:
        if seen["restored"] is None:
            yarn.cluster.command(f"node-resource {full} {nodes[full]['total_mb']} 4")
    assert code == 0 and seen["restored"] and seen["lost"], text[-6000:]
    with open(out / "late.json") as f:
        late = json.load(f)
    with open(out / "lost_node.json") as f:
        lost = json.load(f)
    return {"late": late, "lost_node": lost, "lost": seen["lost"], "resources": seen["resources"],
            "resources_before": {n["node"]: n["total_mb"] for n in nodes.values()}}


def test_an_executor_that_yarn_grants_late_is_waited_for_and_one_never_granted_fails_the_fit_clearly(yarn, late_then_lost_node):
    """YARN grants the application one executor of two and holds the other. A synchronous fit (each round needs
    both workers at once) waits for the missing one, then fails with a ConfigError naming what it needs and what
    the cluster offers, in bounded time; once the node has room again, YARN grants the held executor and the next
    fit waits for it and trains on both nodes."""
    r = late_then_lost_node["late"]
    assert r["executors_at_start"] == 1, r
    held, granted = r["held"], r["granted"]
    assert held["error"].startswith("ConfigError: mode='synchronous'") and "needs its 2 workers running at once" in held["error"], held
    assert "the cluster offers 1" in held["error"] and 30 <= held["seconds"] < 75, held
    assert granted["error"] is None, granted["error"]
    assert_ran_in_containers(granted, yarn)  # both nodes: the held executor came and was used
    assert granted["auc"] > 0.83, granted["auc"]
    assert late_then_lost_node["resources"] == late_then_lost_node["resources_before"]  # the node's room given back


def test_a_nodemanager_lost_mid_fit_costs_its_containers_not_the_fit(yarn, late_then_lost_node):
    """The NodeManager of one executor stopped in the second epoch of an asynchronous fit: its container dies
    with it, the lost tasks run again on the surviving executor (YARN's replacement comes later than these short
    epochs end), and the fit trains every row of every epoch and ends near the Bayes-optimal AUC with its last
    epoch on the surviving node only."""
    lost, s = late_then_lost_node["lost"], late_then_lost_node["lost_node"]
    epochs = s["epochs"]
    assert len(epochs) == 4, epochs
    assert lost in epochs[0]["nodemanagers"] and len(epochs[0]["nodemanagers"]) == 2, (lost, epochs[0])
    assert lost not in epochs[-1]["nodemanagers"], (lost, epochs[-1])  # the last epoch on the surviving node
    gone = set(epochs[0]["containers"]) - set(epochs[-1]["containers"])
    assert len(gone) == 1 and set(epochs[-1]["containers"]) <= set(s["containers"]), epochs  # the lost one's left
    assert all(e["samples"] >= s["train_rows"] for e in epochs), ([e["samples"] for e in epochs], s["train_rows"])
    assert s["auc"] > 0.83, s["auc"]
