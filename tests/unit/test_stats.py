"""sm.stats per epoch: which executors each epoch's tasks ran on (what a fit had, epoch by epoch)."""

from sparkdl_train.driver.stats import EpochStats, FitStats


def test_an_epoch_lists_the_executors_its_tasks_ran_on():
    e = EpochStats(0, 10, 2, 1.0, {0: {"executor_id": "2"}, 1: {"executor_id": "1"}, 2: {"executor_id": "2"}, 3: {}}, [])
    assert e.executors == ["1", "2"]
    assert FitStats(epochs=[e]).as_dict()["epochs"][0]["executors"] == ["1", "2"]
