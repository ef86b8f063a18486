"""The example notebook runs top to bottom (on tiny-llama, for speed) and shows the offline widget."""
from __future__ import annotations

from pathlib import Path

import nbformat
from nbclient import NotebookClient

NOTEBOOK = Path(__file__).resolve().parents[2] / "examples" / "inspect_attention.ipynb"


def test_example_notebook_executes(monkeypatch):
    monkeypatch.setenv("ANCHORLENS_NOTEBOOK_BASE", "tiny-llama")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    html = [o["data"]["text/html"] for o in outputs if o.output_type == "execute_result" and "text/html" in o.get("data", {})]
    widgets = [h for h in html if "<canvas" in h]
    assert len(widgets) == 2  # base and instance views
    assert all("http" not in w for w in widgets)
    assert "<instance>" in widgets[1]
    assert any("image/png" in o.get("data", {}) for o in outputs)  # view.plot(...)
