"""Result files: every figure the README and docs/ show comes from one of these (bench/results/*.json).

:func:`write` stores a benchmark's result with where it came from: the command as run, the commit (with
``+changes`` when the working tree differed), the date, the machine and the library versions. The docs'
tables are rendered from these files (:mod:`bench.harness.docs`), never typed in by hand.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
from importlib import metadata
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(ROOT, "bench", "results")


def command() -> str:
    """The command that is running, as a person would type it (``python -m bench.x.y ...``)."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    name = spec.name if spec is not None and spec.name else os.path.relpath(sys.argv[0], ROOT)
    return " ".join(["python -m " + name if spec is not None else "python " + name, *sys.argv[1:]])


def commit() -> str:
    """HEAD's short hash, ``+changes`` when the library, bench or tests differ from it (the result files
    themselves, outputs of such runs, do not count)."""
    run = lambda *a: subprocess.run(["git", *a], capture_output=True, text=True, cwd=ROOT).stdout.strip()  # noqa: E731
    head = run("rev-parse", "--short", "HEAD") or "unknown"
    changed = run("status", "--porcelain", "--", "sparkdl_train", "bench", "tests", ":(exclude)bench/results")
    return head + ("+changes" if changed else "")


def versions() -> dict[str, str]:
    """Python's, Java's and the installed distributions' versions, read from their metadata (nothing imported)."""
    out = {"python": platform.python_version()}
    for dist in ("pyspark", "keras", "tensorflow", "tensorflow-cpu", "jax", "numpy", "pyarrow"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    try:  # java -version writes to stderr; the lent GPU machine has no Java
        java = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=30).stderr.splitlines()
        out["java"] = java[0] if java else "?"
    except (OSError, subprocess.TimeoutExpired):
        pass
    return out


def machine() -> str:
    mem = ""
    try:
        with open("/proc/meminfo") as f:
            mem = f", {int(f.readline().split()[1]) / 2**20:.0f} GiB"
    except OSError:
        pass
    return f"{platform.machine()}, {os.cpu_count()} cores{mem}, {platform.system()}"


def provenance() -> dict[str, Any]:
    return {"command": command(), "commit": commit(), "date": datetime.date.today().isoformat(), "machine": machine(),
            "versions": versions()}


def path(name: str) -> str:
    return os.path.join(RESULTS, f"{name}.json")


def _store(name: str, data: dict[str, Any]) -> str:
    os.makedirs(RESULTS, exist_ok=True)
    with open(path(name), "w") as f:
        json.dump(data, f, indent=1, sort_keys=False)
        f.write("\n")
    return path(name)


def write(name: str, result: dict[str, Any]) -> str:
    """``result`` with its provenance into bench/results/NAME.json; returns the path."""
    return _store(name, {**provenance(), **result})


def load(name: str) -> dict[str, Any]:
    with open(path(name)) as f:
        return json.load(f)


def rederive(name: str, update: dict[str, Any]) -> str:
    """A result's derived figures (a model's predictions of its measurements) computed again by the model as
    it is now: ``update`` replaces those keys, the measurements and their provenance stay, and ``derived``
    says which command, commit and date computed the replaced figures. Returns the path."""
    data = load(name)
    data.update(update)
    data["derived"] = {"command": command(), "commit": commit(), "date": datetime.date.today().isoformat(),
                       "keys": sorted(update)}
    return _store(name, data)
