"""Settings are declared once (sparkdl_train/config.py); everything else is derived from or checked against that."""

import inspect
import pickle
import re

import pytest
from helpers import ROOT, make_mlp, spark_conf

from sparkdl_train import SparkModel
from sparkdl_train.config import (
    CONF_PREFIX,
    GROUPS,
    EngineConfig,
    FitConfig,
    all_settings,
    argument_settings,
    settings_markdown,
)
from sparkdl_train.errors import ConfigError


def test_every_setting_is_fully_declared_once():
    settings = all_settings()
    args = [s.arg for s in settings]
    keys = [s.key for s in settings if s.key]
    assert len(args) == len(set(args)) and len(keys) == len(set(keys))
    for s in settings:
        assert s.doc.strip() and s.group in GROUPS, s
        assert s.kind.check(s.arg, s.default) == s.default or s.default is None, s  # defaults pass their own check
        if s.key:
            assert not s.key.startswith(CONF_PREFIX)
    # the groups split by concern: parameter-server and allreduce settings say which modes they serve
    assert {s.group for s in settings} == {"core", "data", "ps", "allreduce"}
    assert all(s.modes == ("allreduce",) for s in settings if s.group == "allreduce")
    assert all(s.modes and "allreduce" not in s.modes for s in settings if s.group == "ps")


def test_spark_model_signature_and_docs_come_from_the_declarations():
    params = [p for p in inspect.signature(SparkModel.__init__).parameters if p not in ("self", "model", "custom_objects", "settings")]
    assert sorted(params) == sorted(s.arg for s in argument_settings())
    for s in all_settings():  # every setting, with or without its own parameter, is documented there
        assert re.search(rf"^\s+{s.arg}: ", SparkModel.__doc__, re.M), s.arg
    # a setting without a parameter of its own still works as a keyword
    assert SparkModel(make_mlp(), mode="asynchronous", round_timeout=5)._overrides["round_timeout"] == 5
    with pytest.raises(ConfigError, match=r"unknown setting 'stalenes_bound' \(did you mean 'staleness_bound'\?\)"):
        SparkModel(make_mlp(), mode="asynchronous", stalenes_bound=2)


def test_configuration_table_is_the_generated_one():
    text = open(f"{ROOT}/docs/configuration.md").read()
    table = text.split("<!-- settings:begin -->\n", 1)[1].split("\n<!-- settings:end -->", 1)[0]
    assert table.strip() == settings_markdown().strip(), "docs/configuration.md's table is stale: python -m sparkdl_train.config"


def test_resolution_order_and_sources():
    conf = {CONF_PREFIX + "numWorkers": "3", CONF_PREFIX + "seed": "9", CONF_PREFIX + "ps.stalenessBound": "4"}
    cfg = EngineConfig.resolve(conf, mode="asynchronous", seed=4)
    assert (cfg.num_workers, cfg.seed, cfg.ps.staleness_bound, cfg.staleness_bound) == (3, 4, 4, 4)
    assert (cfg.sources["num_workers"], cfg.sources["seed"], cfg.sources["mode"], cfg.sources["nan_policy"]) == (
        "spark conf", "argument", "argument", "default")
    assert cfg.frequency == "epoch" and EngineConfig(mode="allreduce").frequency == "batch"
    assert "ps.staleness_bound  4" in re.sub(r" +", "  ", cfg.describe())
    assert pickle.loads(pickle.dumps(cfg)) == cfg
    assert cfg.explicit() == {"mode": "asynchronous", "seed": 4}


def test_keys_for_other_modes_are_ignored_but_arguments_are_refused():
    # one spark-defaults.conf serves every mode: an allreduce key does not break a parameter-server fit
    conf = {CONF_PREFIX + "allreduce.compression": "fp16", CONF_PREFIX + "ps.stalenessBound": "2"}
    cfg = EngineConfig.resolve(conf, mode="hogwild")
    assert cfg.allreduce.compression == "fp16" and cfg.mode == "hogwild"
    with pytest.raises(ConfigError, match=r"compression applies to mode='allreduce' only, not mode='hogwild'"):
        EngineConfig(mode="hogwild", compression="fp16")
    with pytest.raises(ConfigError, match=r"epoch_retries applies to mode='allreduce' only"):
        EngineConfig(mode="asynchronous", epoch_retries=1)
    with pytest.raises(ConfigError, match=r"ps_port applies to the modes"):
        EngineConfig(mode="allreduce", ps_port=7000)
    # values that change nothing are accepted anywhere
    assert EngineConfig(mode="allreduce", sparse_embeddings=False).ps.sparse_embeddings is False
    assert EngineConfig(mode="synchronous", compression="none").allreduce.compression == "none"


def test_bad_values_name_the_setting_or_key():
    with pytest.raises(ConfigError, match=r"ps_port must be in \[0, 65535\]"):
        EngineConfig(ps_port=70000)
    with pytest.raises(ConfigError, match="delta_scale must be a positive number"):
        EngineConfig(mode="asynchronous", delta_scale=0)
    with pytest.raises(ConfigError, match=r"spark.sparkdl_train.allreduce.timeout='soon' is not a positive number of seconds"):
        EngineConfig.resolve({CONF_PREFIX + "allreduce.timeout": "soon"})
    with pytest.raises(ConfigError, match=r"spark.sparkdl_train.data.nanPolicy='drop': unknown nan_policy 'drop'"):
        EngineConfig.resolve({CONF_PREFIX + "data.nanPolicy": "drop"})
    with pytest.raises(ConfigError, match="worker_threads must be a positive integer"):
        EngineConfig(worker_threads=True)
    assert not hasattr(FitConfig(), "extra")


def test_sm_config_shows_the_spark_conf_that_will_run(spark):
    sc = spark.sparkContext
    with spark_conf(sc, CONF_PREFIX + "ps.roundTimeout", "123"):  # what spark-submit --conf would have set
        sm = SparkModel(make_mlp(), mode="asynchronous")
        assert sm.config.ps.round_timeout == 123.0 and sm.config.sources["round_timeout"] == "spark conf"
        assert SparkModel(make_mlp(), mode="asynchronous", round_timeout=7).config.ps.round_timeout == 7
    assert SparkModel(make_mlp()).config.ps.round_timeout == 600.0


def test_estimator_params_use_the_same_declarations():
    from sparkdl_train.ml import KerasEstimator

    est = KerasEstimator(mode="hogwild", frequency=4, engineOptions={"delta_scale": 0.5, "round_timeout": 60})
    assert est.getFrequency() == "4"
    with pytest.raises(ConfigError, match="unknown mode 'fast'"):
        KerasEstimator(mode="fast")
    with pytest.raises(ConfigError, match="unknown frequency 'hourly'"):
        KerasEstimator(frequency="hourly")
    with pytest.raises(ConfigError, match=r"unknown setting 'staleness' \(did you mean 'staleness_bound'\?\)"):
        KerasEstimator(engineOptions={"staleness": 2})
    with pytest.raises(ConfigError, match="delta_scale must be a positive number"):
        KerasEstimator(engineOptions={"delta_scale": -1})
    with pytest.raises(ConfigError, match="set 'seed' with the 'seed' param"):
        KerasEstimator(engineOptions={"seed": 3})
    sm = est.spark_model(make_mlp(), None)
    assert (sm.config.mode, sm.config.frequency, sm.config.ps.delta_scale, sm.config.ps.round_timeout) == ("hogwild", 4, 0.5, 60)


def test_saved_settings_that_no_longer_apply_are_set_aside():
    from sparkdl_train.config import split_applicable

    kept, dropped = split_applicable({"mode": "asynchronous", "epoch_retries": 1, "staleness_bound": 2,
                                      "compression": "none", "old_option": 3})
    assert kept == {"mode": "asynchronous", "staleness_bound": 2, "compression": "none"}
    assert dropped == {"epoch_retries": 1, "old_option": 3}
    EngineConfig(**kept)


def test_a_fit_schedules_without_locality_wait_and_restores_the_users_setting(spark, digits):
    """A fit's training tasks do not wait for the executors that cached their partitions (they would run one
    after another there: seen on YARN, tests/cluster/test_yarn.py): spark.locality.wait is 0 in the live conf
    while the fit's jobs run, and the user's value (or its absence) is back afterwards."""
    import keras

    from sparkdl_train.driver.spark_conf import no_locality_wait

    sc = spark.sparkContext
    live = sc._jsc.sc().conf()
    x, y, _, _ = digits
    seen = []

    class Probe(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            seen.append(live.get("spark.locality.wait"))

    assert not live.contains("spark.locality.wait")
    SparkModel(make_mlp(), num_workers=2).fit(sc.parallelize(list(zip(x[:200], y[:200])), 2), epochs=1, batch_size=32,
                                              verbose=0, callbacks=[Probe()])
    assert seen == ["0s"] and not live.contains("spark.locality.wait")
    with spark_conf(sc, "spark.locality.wait", "5s"):
        with no_locality_wait(sc):
            assert live.get("spark.locality.wait") == "0s"
        assert live.get("spark.locality.wait") == "5s"
