"""The executor environment check (preflight), where tasks ran, and progress lines without a terminal."""

import subprocess
import sys
import time

import pytest
from helpers import make_mlp

from sparkdl_train import ConfigError, SparkModel, to_simple_rdd
from sparkdl_train.driver import preflight
from sparkdl_train.driver.progress import FitProgress
from sparkdl_train.driver.reports import EpochTally, Report

DRIVER = {"sparkdl_train": "0.1.0", "keras": "3.15.1"}


def _report(**modules):
    base = {
        "sparkdl_train": {"version": "0.1.0", "file": "/x/sparkdl_train/__init__.py"},
        "keras": {"version": "3.15.2", "file": "/x/keras/__init__.py"},
        "tensorflow": {"version": "2.21.0", "file": "/x/tensorflow/__init__.py"},
    }
    base.update(modules)
    return {"modules": base, "host": "h", "pid": 1, "python": "/p/bin/python", "executor_id": "3"}


def test_a_matching_environment_has_no_problem():
    assert preflight.problems(DRIVER, _report()) == []  # keras patch versions may differ


@pytest.mark.parametrize("modules,words", [
    ({"sparkdl_train": {"error": "ModuleNotFoundError: No module named 'sparkdl_train'"}},
     ["cannot import sparkdl_train", "No module named 'sparkdl_train'"]),
    ({"tensorflow": {"error": "ModuleNotFoundError: No module named 'tensorflow'"}}, ["cannot import tensorflow"]),
    ({"sparkdl_train": {"version": "0.0.9", "file": "/old/sparkdl_train/__init__.py"}},
     ["sparkdl_train 0.0.9 from /old/sparkdl_train/__init__.py", "driver runs 0.1.0"]),
    ({"keras": {"version": "3.9.0", "file": "/k"}}, ["keras 3.9.0", "driver runs keras 3.15.1", "major.minor"]),
])
def test_problems_name_what_the_executor_found(modules, words):
    text = "; ".join(preflight.problems(DRIVER, _report(**modules)))
    for w in words:
        assert w in text, text


def test_local_fit_records_its_master_and_the_driver_as_executor(sc, digits):
    x, y, _, _ = digits
    sm = SparkModel(make_mlp(), num_workers=2)
    sm.fit(to_simple_rdd(sc, x[:400], y[:400]), epochs=1, verbose=0)
    stats = sm.stats.as_dict()
    assert stats["master"] == "local[2]" and stats["executor_ids"] == ["driver"]
    assert all(p["executor_id"] == "driver" for p in stats["epochs"][0]["partitions"].values())
    env = stats["environment"]  # the cached preflight of this application
    assert env and all(r["modules"]["sparkdl_train"]["version"] == "0.1.0" for r in env)


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory):
    """A venv of this very interpreter with nothing installed: a cluster Python that lacks the package (in
    local mode the checkout may still be importable from the working directory, its dependencies are not)."""
    root = tmp_path_factory.mktemp("bare")
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(root / "venv")], check=True, timeout=120)
    return str(root / "venv" / "bin" / "python")


def test_executors_without_sparkdl_train_fail_fast_naming_the_executor_and_the_fix(sc, digits, bare_python, monkeypatch):
    x, y, _, _ = digits
    rdd = to_simple_rdd(sc, x[:200], y[:200])
    preflight.forget(sc)
    monkeypatch.setattr(sc, "pythonExec", bare_python)  # the executors' Python from now on
    try:
        start = time.monotonic()
        with pytest.raises(ConfigError) as info:
            SparkModel(make_mlp(), num_workers=2).fit(rdd, epochs=1, verbose=0)
        elapsed = time.monotonic() - start
    finally:
        monkeypatch.undo()
        preflight.forget(sc)
    text = str(info.value)
    for words in ("executor driver", bare_python, "cannot import sparkdl_train (ModuleNotFoundError: No module named ",
                  "cannot import keras", "./run pack", "--archives sparkdl_env.tar.gz#environment"):
        assert words in text, text
    assert elapsed < 60, f"{elapsed:.0f} s"
    # the same session recovers once the executors' Python is right again
    assert preflight.check_executors(sc)[0]["modules"]["sparkdl_train"]["version"] == "0.1.0"


def test_preflight_runs_once_per_application(sc):
    first = preflight.check_executors(sc)
    jobs = sc.statusTracker().getJobIdsForGroup(None)
    assert preflight.check_executors(sc) is first
    assert sc.statusTracker().getJobIdsForGroup(None) == jobs


# -- progress without a terminal ----------------------------------------------------------------

def _tally(epoch, samples, loss):
    t = EpochTally(epoch, 2)
    t.add(Report(epoch, 0, samples // 2, 3, {"loss": loss}))
    t.add(Report(epoch, 1, samples - samples // 2, 3, {"loss": loss}, done=True))
    return t


def test_without_a_terminal_verbose_1_writes_a_line_per_interval(capsys):
    now = [100.0]  # the progress clock, moved by hand
    p = FitProgress(epochs=2, verbose=1, workers=2, log_interval=10, bar=False, clock=lambda: now[0])
    p.epoch_begin(0)
    p.report(_tally(0, 1000, 0.5))  # before the first interval: nothing
    now[0] += 10
    p.report(_tally(0, 2000, 0.25))
    p.epoch_end(0, {"loss": 0.2}, 4000, 2.0)
    p.close()
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert "\r" not in err and len(lines) == 2, err
    assert lines[0].startswith("Epoch 1/2 - 2,000 samples - ") and "samples/s - loss: 0.25 - workers 1/2" in lines[0]
    assert lines[1] == "Epoch 1/2 - 4,000 samples - 2,000 samples/s - loss: 0.2 - 2.0s - done"


def test_a_fit_under_a_pipe_logs_lines_not_bar_redraws(sc, digits, capfd):
    x, y, _, _ = digits
    SparkModel(make_mlp(), num_workers=2).fit(to_simple_rdd(sc, x, y), epochs=2, batch_size=16, verbose=1)
    err = capfd.readouterr().err
    assert "\r" not in err
    done = [ln for ln in err.splitlines() if ln.endswith(" - done")]
    assert [ln.split(" - ")[0] for ln in done] == ["Epoch 1/2", "Epoch 2/2"]
    assert "loss: " in done[0] and "accuracy: " in done[0]

