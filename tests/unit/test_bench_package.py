"""bench/ is a package run as ``python -m bench.<topic>.<name>``: every script is listed in bench/README.md,
imports from the checkout without path tricks and nothing from tests/, and runs from the checkout's root."""

import ast
import glob
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHARED = ("harness", "workloads")


def _scripts():
    out = []
    for path in sorted(glob.glob(os.path.join(ROOT, "bench", "*", "*.py"))):
        rel = os.path.relpath(path, ROOT)[:-3]
        topic, name = rel.split(os.sep)[1:]
        if topic not in SHARED and name != "__init__" and name != "model":
            out.append(rel.replace(os.sep, "."))
    return out


def test_the_readme_lists_every_script_and_only_those():
    with open(os.path.join(ROOT, "bench", "README.md")) as f:
        listed = set(re.findall(r"^\| `(bench\.[\w.]+)` \|", f.read(), re.M))
    assert listed == set(_scripts()), (sorted(set(_scripts()) - listed), sorted(listed - set(_scripts())))


def test_no_path_tricks_in_bench_tests_or_jobs():
    found = []
    for folder in ("bench", "tests", "jobs"):
        for path in glob.glob(os.path.join(ROOT, folder, "**", "*.py"), recursive=True):
            if "sys.path." + "insert" in open(path).read():  # spelt apart so that a grep of the tree finds none
                found.append(os.path.relpath(path, ROOT))
    assert not found, found


def test_bench_imports_nothing_from_tests():
    tests_modules = {os.path.basename(p)[:-3] for p in glob.glob(os.path.join(ROOT, "tests", "*", "*.py"))}
    for path in glob.glob(os.path.join(ROOT, "bench", "**", "*.py"), recursive=True):
        for node in ast.walk(ast.parse(open(path).read())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            for name in names:
                top = name.split(".")[0]
                assert top != "tests" and top not in tests_modules, f"{os.path.relpath(path, ROOT)} imports {name} from tests/"


def test_every_script_imports_from_the_checkout_root():
    """What ``python -m bench.x.y`` does first, for all of them in one interpreter (no Spark starts)."""
    code = "import importlib, sys\nfor m in sys.argv[1:]:\n    importlib.import_module(m)\nprint('ok')"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-c", code, *_scripts()], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]
