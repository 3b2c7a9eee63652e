"""docs/design.md's layout map and engine table are true: every module of the library is named under its
folder, every listed path exists, and every engine the modes registry can run has a row whose files,
backend hooks, benchmark and doc section exist."""

import glob
import importlib.util
import os
import re

from sparkdl_train import backend

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DESIGN = open(os.path.join(ROOT, "docs", "design.md")).read()


def _table(heading):
    part = DESIGN.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in part.splitlines() if line.startswith("| ") and not line.startswith("| ---")]
    return [[c.strip() for c in row.strip("|").split(" | ")] for row in rows[1:]]


def test_every_listed_path_exists():
    for path, _ in _table("Layout"):
        path = path.strip("`")
        assert os.path.exists(os.path.join(ROOT, path)), f"docs/design.md lists {path}, which does not exist"


def test_every_module_is_named_under_its_folder():
    layout = {row[0].strip("`").rstrip("/"): row[1] for row in _table("Layout")}
    missing = []
    for path in glob.glob(os.path.join(ROOT, "sparkdl_train", "**", "*.py"), recursive=True):
        rel = os.path.relpath(path, ROOT)
        if os.path.basename(rel) == "__init__.py" or rel.startswith("sparkdl_train/elephas/"):
            continue
        folder, stem = os.path.dirname(rel), os.path.basename(rel)[:-3]
        if rel not in layout and not re.search(rf"`{re.escape(stem)}`", layout.get(folder, "")):
            missing.append(rel)
    assert not missing, f"docs/design.md's layout map does not name: {missing}"


def test_every_engine_has_a_true_row():
    modes = open(os.path.join(ROOT, "sparkdl_train", "modes.py")).read()
    engines = set(re.findall(r'"sparkdl_train\.driver\.engines\.\w+:(\w+)"', modes))
    rows = {row[0].strip("`"): row for row in _table("Engines")}
    assert engines <= set(rows), f"engines without a row in docs/design.md: {engines - set(rows)}"
    hooks = set(backend.INTERFACE) | {f.name for f in backend.Capabilities.__dataclass_fields__.values()}
    for name, (_, _, driver, executor, protocol, used, bench, section) in rows.items():
        for cell in (driver, executor, protocol):
            for path in re.findall(r"`([\w/]+\.py)`", cell):
                assert os.path.exists(os.path.join(ROOT, path)), f"{name}: {path} does not exist"
        for hook in re.findall(r"`(\w+)`", used):
            assert hook in hooks, f"{name}: {hook} is not a backend hook or capability"
        assert importlib.util.find_spec(bench.strip("`")) is not None, f"{name}: no benchmark module {bench}"
        page, anchor = re.search(r"\]\(([\w.]+)#([\w-]+)\)", section).groups()
        headings = re.findall(r"^#+ (.+)$", open(os.path.join(ROOT, "docs", page)).read(), re.M)
        slugs = {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}
        assert anchor in slugs, f"{name}: docs/{page} has no section #{anchor}"
