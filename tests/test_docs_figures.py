"""Figures in docs/ come from result files through their generators: a page and its result file agree."""

import json
import os

import model_epochs
from helpers import ROOT


def test_models_page_epochs_table_is_the_result_files():
    with open(model_epochs.RESULT) as f:
        result = json.load(f)
    with open(os.path.join(ROOT, "docs", "models.md")) as f:
        page = f.read()
    start, end = page.index(model_epochs.BEGIN), page.index(model_epochs.END) + len(model_epochs.END)
    assert page[start:end] == model_epochs.render(result), "docs/models.md's table differs: run python bench/model_epochs.py --render"
    shapes = {r["shape"] for r in result["results"]}
    assert {"lstm", "regression", "text_cnn"} <= shapes and all(len(r["engines"]) == 5 for r in result["results"])
