"""GPU placement: Spark's task GPU addresses -> CUDA ordinals -> the task's TensorFlow device."""

import pytest
from helpers import assert_ran_on_executors, run_check_script

from sparkdl_train.errors import ConfigError
from sparkdl_train.worker import gpu


@pytest.mark.parametrize("addresses,visible,expected", [
    (["0"], None, [0]),
    (["3"], None, [3]),
    (["3"], "", [3]),
    (["3"], "2,3", [1]),          # YARN/K8s narrowed the view: physical 3 is the 2nd visible device
    (["5", "3"], "3, 5", [1, 0]),
    (["1"], "GPU-aaa,GPU-bbb", [1]),  # UUIDs in the view: a small number is already an ordinal
    (["GPU-bbb"], "GPU-aaa,GPU-bbb", [1]),
])
def test_cuda_ordinals_remap_through_cuda_visible_devices(addresses, visible, expected):
    assert gpu.cuda_ordinals(addresses, visible) == expected


@pytest.mark.parametrize("addresses,visible,words", [
    (["7"], "2,3", ["'7'", "CUDA_VISIBLE_DEVICES='2,3'"]),
    (["GPU-x"], None, ["'GPU-x'", "unset"]),
    (["2", "2"], None, ["repeated"]),
])
def test_cuda_ordinals_refuse_addresses_the_executor_cannot_see(addresses, visible, words):
    with pytest.raises(ConfigError) as info:
        gpu.cuda_ordinals(addresses, visible)
    for w in words:
        assert w in str(info.value)


def test_placement_pins_the_task_to_its_gpu(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    monkeypatch.setattr(gpu, "task_gpu_addresses", lambda: ["6"])
    monkeypatch.setattr(gpu, "_physical_gpus", lambda: ["gpu0", "gpu1"])
    assert gpu.placement() == {"gpus": ["6"], "cuda_ordinals": [1], "device": "/GPU:1"}
    monkeypatch.setattr(gpu, "_physical_gpus", lambda: [])  # CPU-only TensorFlow: falls back, says so
    assert gpu.placement()["device"] == "/CPU:0"
    monkeypatch.setattr(gpu, "_physical_gpus", lambda: ["gpu0"])
    with pytest.raises(ConfigError, match="sees 1 GPU"):
        gpu.placement()
    monkeypatch.setattr(gpu, "task_gpu_addresses", lambda: [])
    assert gpu.placement() == {}


def test_the_device_is_passed_to_the_task_not_kept_in_module_state(monkeypatch):
    """A task's device reaches its model by argument: the model cache keys on it, and the
    task's statistics record the placement it ran under."""
    from helpers import make_mlp

    from sparkdl_train.model_io import serialize_model
    from sparkdl_train.worker import runtime, tasks

    assert not hasattr(runtime, "device")
    payload = serialize_model(make_mlp(), {})
    on_cpu = runtime.get_model(payload, "/CPU:0")
    assert runtime.get_model(payload, "/CPU:0") is on_cpu and runtime.get_model(payload, None) is not on_cpu
    seen = {}

    class Task:
        settings = tasks.StepSettings(batch_size=4)

        @tasks.on_task_device
        def __call__(self, partition, chunks, *, device=None):
            seen["device"] = device
            return tasks.Partial(partitions={partition: {}})

    monkeypatch.setattr(gpu, "placement", lambda: {"gpus": ["0"], "cuda_ordinals": [0], "device": "/CPU:0"})
    out = Task()(3, [])
    assert seen["device"] == "/CPU:0" and out.partitions[3]["device"] == "/CPU:0"



@pytest.mark.slow
def test_tasks_read_their_gpus_from_spark_on_local_cluster():
    result = run_check_script("gpu_check.py")
    for mode in ("synchronous", "allreduce"):
        r = result[mode]
        # each executor's task got that executor's GPU, re-mapped through CUDA_VISIBLE_DEVICES=3,5;
        # this machine's TensorFlow has no GPU, so the tasks fell back to the CPU
        assert r["placements"] == [[["3"], [0], "/CPU:0"], [["5"], [1], "/CPU:0"]] and r["unplaced"] == 0, r
        assert_ran_on_executors(r["executor_ids"], r["pids"], result["driver_pid"])
        # the fit started right after the session: it waited for both executors (a CI run once trained on one)
        assert r["registration"]["executors"] == 2 and r["registration"]["complete"], r["registration"]
        assert r["loss"][-1] < r["loss"][0] / 2 and r["acc"] > 0.85, r


def test_the_driver_warns_once_a_fit_when_tasks_leave_gpus_idle(caplog):
    """A task given several GPUs trains on the first; the driver says so once per fit, naming the setting."""
    import logging

    from sparkdl_train.driver.engines.base import idle_gpus, warn_idle_gpus

    parts = {0: {"gpus": ["0", "1"], "device": "/GPU:0"}, 1: {"gpus": ["2", "3"], "device": "/GPU:2"}, 2: {"samples": 5}}
    assert idle_gpus(parts) == {0: ["0", "1"], 1: ["2", "3"]}
    assert idle_gpus({0: {"gpus": ["3"]}, 1: {}}) == {}

    class Fit:  # a fit's monitor: anything weakly referenceable
        pass

    fit, other = Fit(), Fit()
    with caplog.at_level(logging.WARNING, logger="sparkdl_train.driver.engines.base"):
        warn_idle_gpus(fit, parts)
        warn_idle_gpus(fit, parts)  # the next epoch: already said
        warn_idle_gpus(other, {0: {"gpus": ["5"]}})  # one GPU a task: nothing to say
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1, warnings
    assert "2 task(s) were given several GPUs (partition 0: ['0', '1'])" in warnings[0]
    assert "2 GPU(s) sat idle" in warnings[0] and "spark.task.resource.gpu.amount=1" in warnings[0]
