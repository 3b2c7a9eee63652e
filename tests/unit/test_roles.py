"""Variable roles (sparkdl_train.roles) and the small-data advice (driver/efficiency.py): pure, no Spark."""

import numpy as np
import pytest

from sparkdl_train.driver.efficiency import FEW_STEPS, few_steps_advice
from sparkdl_train.merge import WeightedMean
from sparkdl_train.ps.state import ServerState
from sparkdl_train.roles import Role, exchanged, is_numeric_mergeable, merged, role


@pytest.mark.parametrize("dtype, trainable, path, want", [
    ("float32", True, "dense/kernel", Role.WEIGHT),
    ("bfloat16", True, "dense/kernel", Role.WEIGHT),
    ("float16", False, "batch_normalization/moving_mean", Role.STATISTIC),
    ("float32", False, "normalization/mean", Role.STATISTIC),
    ("int64", False, "normalization/count", Role.DISCRETE),
    ("int64", False, "adam/iteration", Role.DISCRETE),
    ("bool", False, "flag", Role.DISCRETE),
    ("string", False, "lookup/vocabulary", Role.DISCRETE),
    ("uint32", False, "dropout/seed_generator_state", Role.RANDOM),
])
def test_role(dtype, trainable, path, want):
    assert role(dtype, trainable, path) is want


def test_exchanged_positions():
    roles = [Role.WEIGHT, Role.DISCRETE, Role.STATISTIC, Role.RANDOM, Role.WEIGHT]
    assert exchanged(roles) == [0, 2, 4]
    assert [merged(r) for r in roles] == [True, False, True, False, True]
    assert [is_numeric_mergeable(d) for d in ("float32", "bfloat16", "complex64", "int64", "bool", "uint32")] == [True] * 3 + [False] * 3


def test_averaging_merges_discrete_state_by_maximum():
    a = WeightedMean.of([np.array([1.0, 3.0], np.float32), np.array(5, np.int64)], 1)
    b = WeightedMean.of([np.array([3.0, 5.0], np.float32), np.array(9, np.int64)], 3)
    w, count = a.merge(b).result()
    np.testing.assert_allclose(w, [2.5, 4.5])
    assert count == 9 and count.dtype == np.int64


def test_server_refuses_integer_arrays_by_name():
    with pytest.raises(ValueError, match="array 1 has dtype int64: the parameter server holds floating-point arrays only"):
        ServerState([np.zeros(2, np.float32), np.zeros((), np.int64)], "asynchronous")


def test_few_steps_advice():
    assert few_steps_advice(1, 5, 32, "asynchronous") is None  # one worker: model.fit's steps
    assert few_steps_advice(4, FEW_STEPS, 32, "asynchronous") is None
    text = few_steps_advice(4, 10, 64, "synchronous")
    assert "ran 10 optimizer steps" in text and "would run 40" in text and "batch_size=16" in text and "mode='allreduce'" in text
    assert "lr_scaling='linear'" in few_steps_advice(2, 10, 64, "allreduce")
