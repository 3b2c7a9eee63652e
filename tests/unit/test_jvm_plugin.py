"""sparkdl_train.jvm: the executor plugin's jar, compiled from its source against the installed Spark's jars
(what it does on executors: tests/unit/test_zygote.py, tests/cluster/test_local_cluster.py, test_yarn.py)."""

import os
import shutil
import zipfile

import pytest

from sparkdl_train import jvm
from sparkdl_train.errors import ConfigError


@pytest.mark.skipif(shutil.which("javac") is None and not os.environ.get("JAVA_HOME"), reason="no JDK here")
def test_the_jar_is_compiled_once_per_source_and_holds_the_plugin(tmp_path, monkeypatch):
    monkeypatch.setenv(jvm.CACHE_ENV, str(tmp_path))
    path = jvm.jar()
    assert os.path.dirname(path) == str(tmp_path) and os.path.basename(path).startswith("sparkdl_train-plugin-")
    with zipfile.ZipFile(path) as z:
        names = set(z.namelist())
    assert {"org/sparkdl_train/ExecutorStart.class", "org/sparkdl_train/ExecutorStart$Executor.class",
            "org/sparkdl_train/ExecutorStart$Driver.class"} <= names
    stamp = os.stat(path).st_mtime_ns
    assert jvm.jar() == path and os.stat(path).st_mtime_ns == stamp  # found again, not rebuilt
    assert os.listdir(tmp_path) == [os.path.basename(path)]  # nothing left of the build
    s = jvm.settings("/x/kafka.jar")
    assert s == {"spark.plugins": "org.sparkdl_train.ExecutorStart", "spark.jars": f"/x/kafka.jar,{path}"}


def test_without_javac_the_error_says_how_to_go_without_the_plugin(tmp_path, monkeypatch):
    monkeypatch.setenv(jvm.CACHE_ENV, str(tmp_path))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ConfigError, match="needs javac .* SDT_EXECUTOR_START=off"):
        jvm.jar()
