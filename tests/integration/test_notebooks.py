"""Every notebook under notebooks/ runs top to bottom in a real IPython kernel."""

from __future__ import annotations

import sys

import pytest
from paths import ROOT

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert NOTEBOOKS, "notebooks/ should hold the demo notebook"


def test_the_kernel_runs_this_interpreter():
    # The notebooks must test the memlab_rs installed here: `python3` is the kernel spec of
    # this environment (jupyter_client runs it with sys.executable), not another Python's.
    notebook = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell("import sys; print(sys.executable)")]
    )
    nbclient.NotebookClient(notebook, timeout=120, kernel_name="python3").execute()
    assert notebook.cells[0].outputs[0]["text"].strip() == sys.executable


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs_without_error(path, tmp_path):
    notebook = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        notebook,
        timeout=600,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    )
    client.execute()  # raises CellExecutionError on the first failing cell
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    html = [o["data"]["text/html"] for o in outputs if "text/html" in o.get("data", {})]
    assert any("memlab-lines" in h for h in html)  # the line profile rendered as HTML
