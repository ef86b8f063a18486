"""The example notebook runs top to bottom (on tiny-llama, for speed); saved, it still shows the maps."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOK = Path(__file__).resolve().parents[2] / "examples" / "inspect_attention.ipynb"


@pytest.fixture(scope="module")
def saved_outputs(tmp_path_factory) -> list:
    """Outputs of the executed example notebook after a save and reload (no kernel, no JS state)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("ANCHORLENS_NOTEBOOK_BASE", "tiny-llama")
    try:
        nb = nbformat.read(NOTEBOOK, as_version=4)
        NotebookClient(
            nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK.parent)}}
        ).execute()
    finally:
        mp.undo()
    saved = tmp_path_factory.mktemp("nb") / "saved.ipynb"
    nbformat.write(nb, saved)
    reopened = nbformat.read(saved, as_version=4)
    return [o for cell in reopened.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]


@pytest.mark.slow
def test_no_warning_output(saved_outputs):
    """No red warning (tqdm's "IProgress not found" when ipywidgets is absent) anywhere, first output included."""
    warned = [
        o.text[:200] for o in saved_outputs if o.output_type == "stream" and o.name == "stderr" and "Warning" in o.text
    ]
    assert not warned


@pytest.mark.slow
def test_example_notebook_executes_and_saved_copy_shows_static_maps(saved_outputs):
    outputs = saved_outputs
    assert not [o for o in outputs if o.output_type == "error"]

    views = [o for o in outputs if o.output_type == "execute_result" and "<canvas" in o["data"].get("text/html", "")]
    assert len(views) == 2  # base and instance views
    for o in views:
        data = o["data"]
        assert data["image/png"]  # static map next to the interactive HTML (GitHub, nbconvert, untrusted)
        assert "data:image/png;base64," in data["text/html"]  # and inside the HTML, shown until a script runs
        assert "http" not in data["text/html"]
        assert data["text/plain"].startswith("Inspection of ") and len(data["text/plain"]) < 1000
    assert "<instance>" in views[1]["data"]["text/html"]
    assert "instance" in views[1]["data"]["text/plain"].lower()
    printed = "".join(o.text for o in outputs if o.output_type == "stream" and o.name == "stdout")
    assert "Inspection of " in printed and "top anchors" in printed  # the HF model + tokenizer cell
    # view.plot(...): a matplotlib figure, static by nature
    assert any(
        o.output_type in ("display_data", "execute_result")
        and "image/png" in o.get("data", {})
        and "<canvas" not in o["data"].get("text/html", "")
        for o in outputs
    )
