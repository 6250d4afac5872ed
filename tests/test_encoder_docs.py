"""docs/notes/encoder.md's examples run as written: every ```python block, in order, in one namespace, and what a block
prints is what the page shows beside it (a `# ` comment line right after the print)."""

import contextlib
import io
import re
from pathlib import Path

import pytest

pytest.importorskip("transformers")

PAGE = Path(__file__).resolve().parents[1] / "docs" / "notes" / "encoder.md"
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def test_every_python_block_runs_and_prints_what_the_page_shows():
    text = PAGE.read_text()
    blocks = PYTHON_BLOCK.findall(text)
    assert len(blocks) >= 3
    namespace: dict = {}
    for block in blocks:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(block, str(PAGE), "exec"), namespace)
        lines, printed = block.splitlines(), out.getvalue().splitlines()
        # a `# ` line right after a print line shows the output
        shown = [line[2:] for before, line in zip(lines, lines[1:]) if line.startswith("# ") and "print(" in before]
        for line in shown:
            assert line in printed, (line, printed)
        for line in block.splitlines():
            if line.startswith("print(") and "  # " in line:  # print(x)  # expected
                assert line.split("  # ", 1)[1] in printed, (line, printed)
