"""The README's examples run as written (issue 11): the quick shell examples, then every ```python block.

Shell examples: a fenced block right after `<!-- ci:example -->` runs verbatim, each command in turn (a line ending
in `\\` continues), in one temporary working directory shared by every example, in README order, with W&B offline and
no network; only commands that take under a minute on a CPU carry the marker. `<!-- ci:example exit=N -->` expects exit
status N (default 0). In a block whose lines start with `$ `, those lines are the commands and the lines after each
are its expected output.

Python blocks: every ```python block of the README, in order, verbatim, in one namespace, from that working directory,
after the shell examples (one of which makes the smoke-sized run the Python blocks open).
"""

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import headcount

README = Path(__file__).resolve().parents[1] / "README.md"
MARKER = re.compile(r"<!-- ci:example(?: exit=(\d+))? -->\n```[a-z]*\n(.*?)```", re.DOTALL)
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


@dataclass
class ShellCommand:
    command: str
    exit_code: int
    output: str | None  # the expected output, for `$ ` blocks


def shell_examples(text: str) -> list[ShellCommand]:
    commands = []
    for exit_code, body in MARKER.findall(text):
        exit_code = int(exit_code or 0)
        if body.startswith("$ "):
            for chunk in body.split("$ ")[1:]:
                command, _, output = chunk.partition("\n")
                commands.append(ShellCommand(command, exit_code, output.strip()))
        else:
            lines = body.replace("\\\n", " ").splitlines()
            commands += [ShellCommand(line, exit_code, None) for line in lines if line.strip()]
    return commands


def python_blocks(text: str) -> list[str]:
    return PYTHON_BLOCK.findall(text)


def test_readme_has_examples():
    text = README.read_text()
    assert len(shell_examples(text)) >= 2
    assert len(python_blocks(text)) >= 2


@pytest.fixture(scope="module")
def readme_cwd(tmp_path_factory) -> tuple[Path, list[tuple[ShellCommand, subprocess.CompletedProcess]]]:
    """A temporary working directory after every shell example ran there, with each example's result."""
    cwd = tmp_path_factory.mktemp("readme")
    # The README's commands run from a clone's root: the files they name there come along.
    shutil.copytree(README.parent / "docs" / "examples", cwd / "docs" / "examples")
    src = str(Path(headcount.__file__).resolve().parents[1])  # the commands run the code under test
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")])),
        "WANDB_MODE": "offline",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
    }
    results = []
    for example in shell_examples(README.read_text()):
        proc = subprocess.run(
            ["bash", "-c", example.command], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
        )
        results.append((example, proc))
    return cwd, results


def test_shell_examples_run_verbatim(readme_cwd):
    _, results = readme_cwd
    for example, proc in results:
        said = (proc.stdout + proc.stderr).strip()
        assert proc.returncode == example.exit_code, f"{example.command}\n{said[-3000:]}"
        if example.output is not None:
            assert said == example.output, example.command


def test_python_blocks_run_verbatim(readme_cwd, monkeypatch):
    cwd, _ = readme_cwd
    monkeypatch.chdir(cwd)
    namespace: dict = {"__name__": "__readme__"}
    for i, block in enumerate(python_blocks(README.read_text())):
        exec(compile(block, f"README.md python block {i + 1}", "exec"), namespace)
    run = namespace["run"]
    assert not run.model.training
    assert set(namespace["both"]["mode"]) == {"zero", "resample"}
