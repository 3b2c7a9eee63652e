"""The YARN settings a notebook checks before it starts a session (sparkdl_train.driver.yarn_settings): pure,
no Spark. conf/spark-defaults.yarn.conf, the README's and the notebook's settings, passes as written."""

import os

import pytest
from helpers import ROOT

from sparkdl_train.driver.yarn_settings import ERROR, OK, WARNING, check, errors, mebibytes, read_properties

CONF = os.path.join(ROOT, "conf", "spark-defaults.yarn.conf")


@pytest.fixture
def env(tmp_path):
    (tmp_path / "yarn-site.xml").write_text("<configuration/>")
    return {"HADOOP_CONF_DIR": str(tmp_path), "PYSPARK_PYTHON": "./environment/bin/python"}


def by_setting(findings):
    return {f.setting: f for f in findings}


def test_the_projects_yarn_properties_pass_as_written(env):
    settings = read_properties(CONF)
    assert settings["spark.yarn.dist.archives"] == "hdfs:///apps/sparkdl_env.tar.gz#environment"
    assert "spark.archives" not in settings
    found = check(settings, env, mode="asynchronous")
    assert {f.level for f in found} == {OK}, [f for f in found if f.level != OK]
    assert by_setting(found)["spark.executor.memoryOverhead"].value == "1536m"


def test_no_hadoop_conf_dir_is_an_error_naming_it(tmp_path):
    (f,) = [f for f in errors(check(read_properties(CONF), {})) if f.setting == "HADOOP_CONF_DIR"]
    assert "ResourceManager" in f.message
    (f,) = errors(check(read_properties(CONF), {"YARN_CONF_DIR": str(tmp_path), "PYSPARK_PYTHON": "./environment/bin/python"}))
    assert f.setting == "YARN_CONF_DIR" and "no yarn-site.xml" in f.message


@pytest.mark.parametrize("change, setting, words", [
    ({"spark.executor.memoryOverhead": "512m"}, "spark.executor.memoryOverhead", "at least 1024m"),
    ({"spark.executor.memoryOverhead": None, "spark.executor.memory": "4g"}, "spark.executor.memoryOverhead", "TensorFlow"),
    ({"spark.yarn.dist.archives": None}, "spark.yarn.dist.archives", "./run pack"),
    ({"spark.pyspark.python": "/usr/bin/python3"}, "spark.pyspark.python", "./environment/bin/python"),
    ({"spark.pyspark.driver.python": "./environment/bin/python"}, "spark.pyspark.driver.python", "client mode"),
    ({"spark.submit.deployMode": "cluster"}, "spark.submit.deployMode", "client mode"),
    ({"spark.executor.resource.gpu.amount": "1"}, "spark.executor.resource.gpu.discoveryScript", "discovery script"),
    ({"spark.executor.resource.gpu.amount": "1"}, "spark.task.resource.gpu.amount", "one GPU per training task"),
])
def test_a_missing_or_wrong_setting_is_an_error_naming_the_setting(env, change, setting, words):
    settings = read_properties(CONF)
    for key, value in change.items():
        if value is None:
            settings.pop(key)
        else:
            settings[key] = value
    found = by_setting(errors(check(settings, env)))
    assert setting in found and words in found[setting].message, found


def test_a_notebook_whose_pyspark_python_variable_disagrees_is_told_to_set_it(env):
    """pyspark in a kernel reads PYSPARK_PYTHON, never spark.pyspark.python (a CI run of notebooks/yarn.ipynb
    had its executors run the node's python3, without TensorFlow)."""
    for value in (None, "/usr/bin/python3"):
        e = {k: v for k, v in env.items() if k != "PYSPARK_PYTHON"} | ({"PYSPARK_PYTHON": value} if value else {})
        (f,) = errors(check(read_properties(CONF), e))
        assert f.setting == "PYSPARK_PYTHON" and "os.environ['PYSPARK_PYTHON'] = './environment/bin/python'" in f.message


def test_gpus_asked_for_with_their_script_pass_and_name_yarns_resource(env):
    settings = dict(read_properties(CONF), **{"spark.executor.resource.gpu.amount": "1", "spark.task.resource.gpu.amount": "1",
                                             "spark.executor.resource.gpu.discoveryScript": "/opt/spark/getGpusResources.sh"})
    found = check(settings, env)
    assert not errors(found)
    assert "yarn.io/gpu" in by_setting(found)["spark.executor.resource.gpu.amount"].message


def test_a_local_archive_and_dynamic_allocation_are_warnings_and_allreduce_refuses_dynamic_allocation(env):
    settings = dict(read_properties(CONF), **{"spark.yarn.dist.archives": "sparkdl_env.tar.gz#environment",
                                             "spark.dynamicAllocation.enabled": "true"})
    found = by_setting(check(settings, env, mode="asynchronous"))
    key = "spark.yarn.dist.archives"
    assert found[key].level == WARNING and "HDFS" in found[key].message
    assert found["spark.dynamicAllocation.enabled"].level == WARNING
    assert by_setting(check(settings, env, mode="allreduce"))["spark.dynamicAllocation.enabled"].level == ERROR


def test_sizes_read_as_spark_reads_them():
    assert mebibytes("1536m") == 1536 and mebibytes("2g") == 2048 and mebibytes("1024") == 1024
    assert mebibytes("512k") == 0.5
    with pytest.raises(ValueError, match="not a size"):
        mebibytes("lots")


def test_spark_archives_works_but_is_a_warning_naming_spark_yarn_dist_archives(env):
    """--archives (spark.archives) on YARN: the executors unpack the archive again, each before its first task."""
    settings = dict(read_properties(CONF), **{"spark.archives": "hdfs:///apps/sparkdl_env.tar.gz#environment"})
    del settings["spark.yarn.dist.archives"]
    found = check(settings, env, mode="asynchronous")
    assert not errors(found)
    (warning,) = [f for f in found if f.setting == "spark.archives"]
    assert warning.level == WARNING and "spark.yarn.dist.archives" in warning.message and "unpacks" in warning.message
