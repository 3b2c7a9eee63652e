"""jobs/*.py loaded as modules by the scripts that run several jobs in one application
(tests/scripts/standalone_jobs.py, yarn_jobs.py). Imports nothing of the checkout: a YARN client passes its
PYTHONPATH on to the containers, so a driver that needs this folder must not need the checkout's root too
(the executors would import sparkdl_train from the checkout, not from the shipped archive)."""

import importlib.util
import os
import sys

JOBS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "jobs")


def load_job(name: str):
    """jobs/<name>.py as a module whose functions cloudpickle ships by value (executors cannot import jobs/)."""
    from pyspark import cloudpickle

    spec = importlib.util.spec_from_file_location(f"sparkdl_train_job_{name}", os.path.join(JOBS, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    cloudpickle.register_pickle_by_value(module)
    return module
