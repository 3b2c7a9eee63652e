"""Every figure in the README and docs/ comes from a result file in bench/results/ through
bench/harness/docs.py: a page and its result files agree, each result file says where it came from, and
prose carries no measured figure of its own (a ratio or an AUC typed into a sentence would be a second
source that nothing keeps true)."""

import json
import os
import re

import pytest

from bench.harness import docs, results

PAGES = docs.pages()
# what a measured figure looks like in prose: a ratio (1.27x), a samples/s rate, an AUC or an efficiency
FIGURE = re.compile(r"\b\d+(\.\d+)?[x×](?![\w])|\b\d[\d,.]* (samples|images)/s\b|\bAUC (of )?0\.\d{3,}|\befficiency (of )?0\.\d{2,}")


def test_every_page_equals_its_result_files():
    assert docs.main(["--check"]) == 0, "a page's tables differ from bench/results: run python -m bench.harness.docs"


def test_every_table_has_a_renderer_and_every_renderer_a_page():
    used = set()
    for page in PAGES:
        with open(page) as f:
            used |= {m.group("name") for m in docs.MARK.finditer(f.read())}
    assert used == set(docs.RENDERERS), (sorted(used - set(docs.RENDERERS)), sorted(set(docs.RENDERERS) - used))


@pytest.mark.parametrize("name", sorted(f[:-5] for f in os.listdir(results.RESULTS) if f.endswith(".json")))
def test_every_result_file_says_where_it_came_from(name):
    r = results.load(name)
    assert {"command", "commit", "date", "machine", "versions"} <= set(r), f"{name}.json lacks provenance: {sorted(r)[:12]}"
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", r["date"]), r["date"]


def test_prose_states_no_figure_of_its_own():
    strays = []
    for page in PAGES:
        with open(page) as f:
            text = docs.MARK.sub("", f.read())
        text = re.sub(r"```.*?```", "", text, flags=re.S)  # commands and code
        for n, line in enumerate(text.splitlines(), 1):
            if FIGURE.search(line):
                strays.append(f"{os.path.relpath(page, results.ROOT)}: {line.strip()[:140]}")
    assert not strays, "figures outside the rendered tables (put them in a result file and a table):\n" + "\n".join(strays)


def test_the_models_page_table_covers_the_corpus_shapes():
    r = results.load("model_epochs")
    shapes = {row["shape"] for row in r["results"]}
    assert {"lstm", "regression", "text_cnn"} <= shapes and all(len(row["engines"]) == 5 for row in r["results"])
    json.dumps(r)


def _slugs(path):
    with open(path) as f:
        headings = re.findall(r"^#+ (.+)$", re.sub(r"```.*?```", "", f.read(), flags=re.S), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_every_link_between_pages_lands():
    broken = []
    for page in PAGES + [os.path.join(results.ROOT, "bench", "README.md")]:
        with open(page) as f:
            text = f.read()
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            path, _, anchor = target.partition("#")
            full = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
            if not os.path.exists(full):
                broken.append(f"{os.path.relpath(page, results.ROOT)} -> {target}")
            elif anchor and full.endswith(".md") and anchor not in _slugs(full):
                broken.append(f"{os.path.relpath(page, results.ROOT)} -> {target} (no such section)")
    assert not broken, "\n".join(broken)
