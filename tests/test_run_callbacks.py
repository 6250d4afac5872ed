"""No module calls back into `Run` (headcount/api.py; issue 33 item 6): the modules api.py hands work to (api_edges.py,
api_stability.py, the session, the scans) take plain values and return tables, and api.py alone strings its own
methods together. Checked on the code: no module but api.py calls a method of Run's own on a `run` it was given."""

import ast
from pathlib import Path

from headcount.api import Run
from headcount.run_dir import FinishedRun

SRC = Path(__file__).resolve().parents[1] / "src" / "headcount"
# Run's own methods and properties: a FinishedRun (what `run` names in the session and the scans) has none of these
RUN_ONLY = {name for name in vars(Run) if not name.startswith("_")} - set(dir(FinishedRun))


def callbacks(source: str) -> list[str]:
    """The calls of Run's own methods on a name `run` or an attribute `.run` (run.scan(...), self.run.evaluate(...))
    and the reads of its properties there."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in RUN_ONLY:
            owner = node.value
            if (isinstance(owner, ast.Name) and owner.id == "run") or (
                isinstance(owner, ast.Attribute) and owner.attr == "run" and ast.unparse(owner.value) == "self"
            ):
                found.append(f"{ast.unparse(node)} (line {node.lineno})")
    return found


def test_no_module_but_api_calls_back_into_run():
    offenders = {
        str(path.relative_to(SRC)): found
        for path in sorted(SRC.rglob("*.py"))
        if path.name != "api.py" and (found := callbacks(path.read_text()))
    }
    assert offenders == {}


def test_the_check_sees_a_callback():
    assert {"scan", "evaluate", "task_settings"} <= RUN_ONLY
    assert callbacks("def f(run):\n    return run.scan('single_head', task=run.task_settings(None))\n") == [
        "run.scan (line 2)",
        "run.task_settings (line 2)",
    ]
    assert callbacks("def f(run):\n    return run.examples('val', None, 'split')\n") == []  # a FinishedRun's
    assert callbacks("wandb.run.summary.update({})") == []  # W&B's run
