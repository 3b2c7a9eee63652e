"""notebooks/quickstart.ipynb runs top to bottom in a fresh kernel (with fewer rows) and reaches
a meaningful AUC with both engines."""

import json
import os
import sys

import pytest
from helpers import ROOT

NOTEBOOK = os.path.join(ROOT, "notebooks", "quickstart.ipynb")


@pytest.mark.slow
def test_quickstart_notebook_executes(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")

    # the kernel runs this interpreter (its venv has sparkdl_train), with small sizes
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    monkeypatch.setenv("QUICKSTART_ROWS", "120000")
    monkeypatch.setenv("QUICKSTART_EPOCHS", "2")
    monkeypatch.setenv("QUICKSTART_OUT", str(tmp_path / "out"))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError naming the cell if any cell fails

    def outputs(cell):
        return cell.get("outputs", [])

    text = {i: "".join(o.get("text", "") for o in outputs(c) if o.get("output_type") == "stream") for i, c in enumerate(nb.cells)}
    results_cell = next(c for c in nb.cells if "results" in c.get("metadata", {}).get("tags", []))
    results = json.loads("".join(o["text"] for o in outputs(results_cell) if o.get("output_type") == "stream"))
    assert set(results["engines"]) == {"parameter server", "ring allreduce"}
    for name, r in results["engines"].items():
        assert r["epochs"] == 2
        assert r["val_auc"] >= results["bayes_auc"] - 0.07, (name, r, results["bayes_auc"])
    assert results["test_auc"] == pytest.approx(results["test_auc_keras"], abs=0.005)
    # PNG bytes decoded on the executors by a batch transform: 10 classes, far above chance (0.1)
    assert results["images"]["epochs"] == 6 and results["images"]["test_accuracy"] > 0.5, results["images"]
    # progress bars were drawn for both fits, a figure was plotted, predictions were shown. With ipywidgets
    # installed tqdm.auto draws widgets, whose last state the client keeps in the notebook's metadata; without,
    # text bars in the stream (their live look in a browser: tests/cluster/test_yarn.py's notebook test)
    all_text = "\n".join(text.values()) + "\n" + "\n".join(_strings(nb.metadata.get("widgets", {})))
    all_text = all_text.replace("\u2007", " ")  # tqdm's widgets space their text with figure spaces
    assert all_text.count("Epoch 1/2") >= 2 and "samples/s" in all_text, all_text[-3000:]
    assert any("image/png" in o.get("data", {}) for c in nb.cells for o in outputs(c))
    assert "| ctr|" in all_text or "ctr|" in all_text
    assert "predicted_digit" in all_text
    assert os.path.exists(tmp_path / "out" / "ctr_model" / "model.keras")


def _strings(value):
    """Every string inside a JSON value (the widgets' saved state)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)
