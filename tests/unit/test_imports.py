"""Module boundaries: no import circles in sparkdl_train (module-level or inside functions), data/
independent of the engines, and executor-side modules independent of the driver's."""

import ast
import os

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "sparkdl_train")


def _module(path):
    rel = os.path.relpath(path, os.path.dirname(ROOT))[:-3].replace(os.sep, ".")
    return rel[: -len(".__init__")] if rel.endswith(".__init__") else rel


def _graph():
    """{module: {imported sparkdl_train modules}}, every import statement anywhere in the file."""
    modules = {}
    for d, _, files in os.walk(ROOT):
        for f in files:
            if f.endswith(".py"):
                modules[_module(os.path.join(d, f))] = os.path.join(d, f)
    graph = {}
    for mod, path in modules.items():
        package = mod if path.endswith("__init__.py") else mod.rsplit(".", 1)[0]
        deps = set()
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
                names = [f"{base}.{a.name}" for a in node.names]
                targets = [n for n in names if n in modules] or [base]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            for t in targets:
                while t and t not in modules and "." in t:
                    t = t.rsplit(".", 1)[0]
                if t in modules and t != mod:
                    deps.add(t)
        graph[mod] = deps
    return graph


def _cycles(graph):
    found, state, stack = [], {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for d in sorted(graph[m]):
            if m.startswith(d + "."):
                continue  # a submodule reading its own package (``from .. import x``)
            if state.get(d) == "open":
                found.append(stack[stack.index(d):] + [d])
            elif d not in state:
                visit(d)
        stack.pop()
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m)
    return found


def test_no_import_circles():
    assert _cycles(_graph()) == []


def test_data_does_not_import_the_engines_or_the_ring():
    graph = _graph()
    for mod, deps in graph.items():
        if mod.startswith("sparkdl_train.data"):
            bad = [d for d in deps if d.startswith(("sparkdl_train.allreduce", "sparkdl_train.driver", "sparkdl_train.ps"))]
            assert not bad, (mod, bad)


def test_executor_side_modules_do_not_import_the_driver():
    graph = _graph()
    for mod, deps in graph.items():
        if mod.startswith(("sparkdl_train.worker", "sparkdl_train.allreduce", "sparkdl_train.ps")):
            assert not [d for d in deps if d.startswith("sparkdl_train.driver")], (mod, deps)


def test_one_networking_package_serves_every_server():
    """Framing, the handshake and the authenticated server live in sparkdl_train.net; the ring and the
    report server use it without importing the parameter server, and net needs only the wire format
    (and the errors it raises)."""
    graph = _graph()
    users = ("sparkdl_train.allreduce.transport", "sparkdl_train.driver.reports", "sparkdl_train.worker.report",
             "sparkdl_train.net.server", "sparkdl_train.ps.server", "sparkdl_train.ps.client")
    for mod in users:
        assert any(d.startswith("sparkdl_train.net") for d in graph[mod]), mod
        if not mod.startswith("sparkdl_train.ps"):
            assert not [d for d in graph[mod] if d.startswith("sparkdl_train.ps")], (mod, graph[mod])
    for mod, deps in graph.items():
        if mod.startswith("sparkdl_train.net"):
            assert deps <= {"sparkdl_train.wire", "sparkdl_train.errors", "sparkdl_train.net", "sparkdl_train.net.framing",
                            "sparkdl_train.net.auth", "sparkdl_train.net.tls", "sparkdl_train.net.ports"}, (mod, deps)


def test_the_package_exports_load_lazily_and_all_resolve():
    """Importing sparkdl_train (every Python worker and the worker daemon do) loads none of its
    modules; each exported name resolves."""
    import subprocess
    import sys

    code = ("import sys, sparkdl_train as s; loaded = sorted(m for m in sys.modules if m.startswith('sparkdl_train.')); "
            "assert loaded == [], loaded; assert set(s.__all__) == set(s._EXPORTS); [getattr(s, n) for n in s.__all__]; "
            "assert 'numpy' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


FRAMEWORKS = {"tensorflow": "sparkdl_train.backend.tensorflow", "jax": "sparkdl_train.backend.jax"}


def test_only_its_backend_module_imports_a_framework():
    """The backend seam: ``import tensorflow`` / ``import jax`` (anywhere in a file, inside
    functions too) only in sparkdl_train/backend/<framework>.py and its own modules beside it
    (backend/<framework>_*.py: jax_collectives)."""
    found = []
    for d, _, files in os.walk(ROOT):
        for f in files:
            if not f.endswith(".py"):
                continue
            path = os.path.join(d, f)
            mod = _module(path)
            for node in ast.walk(ast.parse(open(path).read())):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and not node.level:
                    names = [node.module or ""]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top in FRAMEWORKS and mod != FRAMEWORKS[top] and not mod.startswith(FRAMEWORKS[top] + "_"):
                        found.append(f"{mod}: import {name}")
    assert found == [], found
    assert all(os.path.exists(os.path.join(ROOT, "backend", m.rsplit(".", 1)[1] + ".py")) for m in FRAMEWORKS.values())
