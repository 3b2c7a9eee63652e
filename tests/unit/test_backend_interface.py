"""The backend seam: both backends provide every member of ``backend.Backend``, declare their capabilities
in one place, and do what they declare; nothing outside backend/ asks for a framework by name."""

import ast
import glob
import os

import pytest

from sparkdl_train import backend

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("name", backend.SUPPORTED)
def test_each_backend_module_provides_the_interface(name):
    if name == "jax":
        pytest.importorskip("jax")
    mod = backend.module(name)
    missing = [m for m in backend.INTERFACE if not hasattr(mod, m)]
    assert not missing, f"backend {name} lacks {missing}"
    assert mod.NAME == name and mod.CAPABILITIES is backend.CAPABILITIES[name]


def test_capabilities_are_declared_for_every_supported_backend_without_importing_it():
    assert set(backend.CAPABILITIES) == set(backend.SUPPORTED)
    for name, can in backend.CAPABILITIES.items():
        assert can.framework == name
        assert can.gradient_buckets or can.buckets_refused, f"{name}: refusing buckets needs the reason it gives"


def test_jax_refuses_buckets_with_the_declared_reason():
    pytest.importorskip("jax")
    import inspect

    src = inspect.getsource(backend.module("jax").FusedStep.__init__)
    assert "CAPABILITIES.buckets_refused" in src


def _imports(path):
    tree = ast.parse(open(path).read())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            yield node.level, node.module or ""
        elif isinstance(node, ast.Import):
            for a in node.names:
                yield 0, a.name


def test_backend_imports_nothing_above_its_layer():
    allowed = {"trees", "table_rows", "roles", "errors", "_compat", "halfwidth", "wire", "_folders"}
    for path in glob.glob(os.path.join(ROOT, "sparkdl_train", "backend", "*.py")):
        for level, module in _imports(path):
            if level == 2:  # from ..x import
                assert module.split(".")[0] in allowed or module == "", f"{os.path.basename(path)} imports ..{module}"
            if level == 0 and module.startswith("sparkdl_train."):
                top = module.split(".")[1]
                assert top in allowed | {"backend"}, f"{os.path.basename(path)} imports {module}"


def test_no_module_outside_backend_compares_framework_names():
    """`keras_backend() == "jax"` or a getattr probe of a backend module: ask ``backend.capabilities()``."""
    offenders = []
    for path in glob.glob(os.path.join(ROOT, "sparkdl_train", "**", "*.py"), recursive=True):
        rel = os.path.relpath(path, ROOT)
        if rel.startswith(("sparkdl_train/backend/", "sparkdl_train/elephas/")):
            continue
        src = open(path).read()
        for pattern in ('== "jax"', '!= "jax"', '== "tensorflow"', '!= "tensorflow"', "getattr(backend.current()"):
            if pattern in src:
                offenders.append(f"{rel}: {pattern}")
    assert not offenders, offenders
