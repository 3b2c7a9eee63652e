"""Benchmarks: ``python -m bench.<topic>.<name>`` from the checkout root (bench/README.md lists them).

Every process a benchmark starts (``python -m bench...`` children, local-cluster executors) finds this
package and the checkout through PYTHONPATH, set here once.
"""

import os

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (_ROOT, os.environ.get("PYTHONPATH")) if p)
