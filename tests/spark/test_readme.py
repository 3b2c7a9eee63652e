"""README.md's code is what the tests run (tests/support/readme.py reads it from the README):

* Quickstart: its Python runs as written, in a fresh interpreter, and learns;
* Set-up: `./run job` runs in tests/spark/test_ctr.py (slow) as written; `./run test` is what .ci/run runs;
* Clusters: `./run pack` builds the standalone tests' archive (conftest's ``env_archive``) and
  `./run submit` trains on the standalone cluster (tests/cluster/test_standalone.py, slow), as written.

A command added to either section that no test runs fails here."""

import os
import re

import readme
from helpers import ROOT

# each README command, by its first words, and the test that runs it as written
RUN_BY = {
    "Set-up": {"./run job": "tests/spark/test_ctr.py::test_default_job_gets_within_0_02_of_the_bayes_optimal_auc",
               "./run test": ".ci/run"},
    "Clusters": {"./run pack": "tests/conftest.py::env_archive",
                 "./run submit": "tests/cluster/test_standalone.py::test_the_readme_cluster_commands_train_on_the_standalone_cluster"},
    "YARN": {'eval "$(./run yarn up)"': "tests/cluster/test_yarn.py::yarn",
             "./run hdfs dfs -put": "tests/cluster/test_yarn.py::yarn",
             "./run submit --load-spark-defaults --properties-file conf/spark-defaults.yarn.conf jobs/train_ctr.py":
                 "tests/cluster/test_yarn.py::test_readme_client_mode_line_trains_in_yarn_containers_from_hdfs",
             "./run submit --load-spark-defaults --properties-file conf/spark-defaults.yarn.conf --deploy-mode cluster":
                 "tests/cluster/test_yarn.py::test_cluster_mode_line_resumes_from_its_hdfs_checkpoint_when_the_application_master_is_lost"},
}


def _covered(title):
    found = readme.commands(title)
    assert found, f"README.md's {title} section has no ```bash block"
    for command in found:
        owners = [prefix for prefix in RUN_BY[title] if command == prefix or command.startswith(prefix + " ")]
        assert owners, f"README {title}: no test runs {command!r} (tests/spark/test_readme.py RUN_BY)"
    return found


def test_setup_gives_exactly_two_commands_the_job_and_the_tests():
    found = _covered("Set-up")
    assert [c.split()[:2] for c in found] == [["./run", "job"], ["./run", "test"]], found


def test_ci_runs_the_readmes_test_command():
    (test,) = [c for c in readme.commands("Set-up") if c.startswith("./run test")]
    with open(os.path.join(ROOT, ".ci", "run")) as f:
        ci = f.read()
    assert re.search(rf"^{re.escape(test)}(\s|$)", ci, re.M), f"{test!r} is not a line of .ci/run"


def test_every_cluster_command_is_run_by_a_test():
    found = _covered("Clusters")
    assert {c.split()[1] for c in found} == {"pack", "submit"}, found


def test_every_yarn_command_is_run_by_a_test():
    found = _covered("YARN")
    assert len(found) == 4, found


def test_the_parser_joins_continuations_and_drops_comments():
    text = "## Clusters\n\n```bash\n./run pack -o x.tar.gz   # a comment\n\n./run submit --master m \\\n  --conf a=b \\\n  job.py --flag 1\n```\n## Next\n"
    assert readme.commands("Clusters", text) == ["./run pack -o x.tar.gz", "./run submit --master m --conf a=b job.py --flag 1"]


def test_run_submit_finds_spark_from_a_shell_without_the_venv(tmp_path):
    """`.venv/bin/spark-submit` from such a shell stops with "Could not find valid SPARK_HOME" (its
    find-spark-home runs the system python3); `./run submit` sets SPARK_HOME from the venv's pyspark."""
    import pyspark

    proc = readme.run(f"{os.path.join(ROOT, 'run')} submit --version", str(tmp_path), timeout=300)
    out = proc.stdout + proc.stderr
    assert "version " + pyspark.__version__.split(".dev")[0] in out, out[-2000:]


def test_the_readme_stays_short():
    with open(readme.README) as f:
        lines = f.read().count("\n")
    assert lines <= 200, f"README.md has {lines} lines (at most 200: details belong in docs/)"


def test_the_quickstart_runs_as_written_and_learns(spark, capsys):
    """The Quickstart's Python, run as written in a namespace of its own. Its ``getOrCreate()`` finds this
    process's local[2] session (the master it names), so it shares the suite's JVM and Python workers; it
    makes its own data and model, and its evaluate line prints the accuracy of a model that learned."""
    import ast

    code = readme.python("Quickstart")
    assert "SparkSession.builder" in code and "SparkModel(" in code and ".fit(" in code, code
    assert 'master("local[2]")' in code and spark.sparkContext.master == "local[2]"
    scope = {"__name__": "__quickstart__"}
    exec(compile(code, "README.md#quickstart", "exec"), scope)
    out = capsys.readouterr().out
    logs = [ast.literal_eval(line) for line in out.splitlines() if line.startswith("{")]
    assert len(logs) == 1 and logs[0]["accuracy"] >= 0.9, out[-3000:]
    assert "prediction" in out and scope["history"].history["loss"][-1] < scope["history"].history["loss"][0], out[-3000:]
