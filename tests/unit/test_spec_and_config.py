import numpy as np
import pyarrow as pa
import pytest

from sparkdl_train.config import EngineConfig, FitConfig
from sparkdl_train.data.spec import InputInfo, resolve_columns
from sparkdl_train.errors import ConfigError, DataError

TWO = [InputInfo("dense", (3,), "float32"), InputInfo("cat", (2,), "int32")]


def test_single_input_concatenates_listed_columns_and_reshapes_to_model():
    m = resolve_columns([InputInfo("x", (3,), "float32")], ["a", "b"], "y")
    rb = pa.RecordBatch.from_pydict({"a": [1.0, 2.0], "b": [[3.0, 4.0], [5.0, 6.0]], "y": [0, 1]})
    x, y, w = m.batch_from_arrow(rb)
    np.testing.assert_array_equal(x, [[1, 3, 4], [2, 5, 6]])
    assert x.dtype == np.float32 and w is None and y.dtype == np.float32
    assert m.columns() == ["a", "b", "y"]


def test_scalar_column_becomes_a_column_vector_for_shape_1_inputs():
    m = resolve_columns([InputInfo("x", (1,), "float32")], "a", "y")
    x, _, _ = m.batch_from_arrow(pa.RecordBatch.from_pydict({"a": [1.0, 2.0], "y": [0, 1]}))
    assert x.shape == (2, 1)


def test_multi_input_dict_and_list_and_dtypes():
    rb = pa.RecordBatch.from_pydict({"d1": [1.0], "d2": [2.0], "d3": [3.0], "c": [[7, 8]], "y": [1.0], "w": [0.5]})
    m = resolve_columns(TWO, {"dense": ["d1", "d2", "d3"], "cat": "c"}, "y", "w")
    x, y, w = m.batch_from_arrow(rb)
    assert set(x) == {"dense", "cat"} and x["cat"].dtype == np.int32 and x["dense"].shape == (1, 3)
    assert w.tolist() == [0.5]
    m2 = resolve_columns(TWO, [["d1", "d2", "d3"], "c"], "y")
    x2, _, _ = m2.batch_from_arrow(rb)
    assert isinstance(x2, list) and x2[1].tolist() == [[7, 8]]


def test_mapping_errors():
    with pytest.raises(DataError, match="has 2 inputs"):
        resolve_columns(TWO, "features", "y")
    with pytest.raises(DataError, match=r"missing \['cat'\]"):
        resolve_columns(TWO, {"dense": "a"}, "y")
    with pytest.raises(DataError, match="3 entries"):
        resolve_columns(TWO, ["a", "b", "c"], "y")
    m = resolve_columns([InputInfo("x", (4,), "float32")], "a", "y")
    with pytest.raises(DataError, match=r"shape \(3,\).*expects \(4,\)"):
        m.batch_from_arrow(pa.RecordBatch.from_pydict({"a": [[1.0, 2.0, 3.0]], "y": [1.0]}))


def test_config_validation_names_the_argument():
    with pytest.raises(ConfigError, match="unknown mode 'fast'"):
        EngineConfig(mode="fast")
    with pytest.raises(ConfigError, match="unknown frequency"):
        EngineConfig(frequency="hourly")
    with pytest.raises(ConfigError, match="num_workers"):
        EngineConfig(num_workers=0)
    with pytest.raises(ConfigError, match="batch_size"):
        FitConfig(batch_size=0)
    with pytest.raises(ConfigError, match="epochs"):
        FitConfig(epochs=-1)
    with pytest.raises(ConfigError, match="validation_split"):
        FitConfig(validation_split=1.0)


def test_config_reads_spark_conf_keys_and_explicit_args_win():
    conf = {"spark.sparkdl_train.numWorkers": "3", "spark.sparkdl_train.seed": "9"}
    cfg = EngineConfig.from_spark_conf(conf, seed=4)
    assert (cfg.num_workers, cfg.seed) == (3, 4)
    with pytest.raises(ConfigError, match="spark.sparkdl_train.numWorkers"):
        EngineConfig.from_spark_conf({"spark.sparkdl_train.numWorkers": "many"})
