"""The commands compose a config, check the component names it uses and list the components before torch and
Lightning load, so that a mistake or `--list` answers at once (docs/BENCHMARKS.md, scripts/bench_cli.py). Each case
runs a command's `main` in a fresh interpreter and then asks which heavy libraries that imported: a top-level
`import torch` anywhere on the path (a config module, a callback, a module the command imports) fails here."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
HEAVY = ["torch", "lightning", "transformers", "datasets", "pandas", "matplotlib"]
PROBE = """
import json, sys
sys.argv = {argv!r}
from headcount.cli.{command} import main
code = 0
try:
    main()
except SystemExit as e:
    code = e.code
sys.stdout.flush()
print(json.dumps({{"exit": code, "loaded": [m for m in {heavy!r} if m in sys.modules]}}))
"""


def run_command(command: str, args: list[str], cwd: Path) -> tuple[dict, str, str]:
    """(exit code and heavy modules loaded, stdout before that line, stderr) of `headcount-<command> <args>`."""
    code = PROBE.format(argv=[f"headcount-{command}", *args], command=command, heavy=HEAVY)
    env = {"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin", "HOME": str(cwd), "COLUMNS": "200"}
    done = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    *printed, last = done.stdout.rstrip("\n").split("\n")
    return json.loads(last), "\n".join(printed), done.stderr


def finished_looking_run(folder: Path) -> Path:
    """A folder with the files headcount-ablate looks for before Hydra starts (a config, last.ckpt, metrics.json):
    a name is refused before any of them is read."""
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "config.yaml").write_text("seed: 0\n")
    (folder / "checkpoints").mkdir()
    (folder / "checkpoints" / "last.ckpt").write_bytes(b"")
    (folder / "metrics.json").write_text("{}")
    return folder


CASES = [
    ("train", ["--list"], 0, "ablation mode"),
    ("train", ["model=nosuch"], 2, "error: model='nosuch': allowed: "),
    ("train", ["ablation.mode=zro"], 2, "error: ablation.mode='zro': allowed: zero, mean, resample, patch; did you"),
    ("train", ["ablation.metric=los"], 2, "error: ablation.metric='los': allowed: loss, "),
    ("train", ["task=ioi", "task.source=ioj"], 2, "error: task.source='ioj': allowed: "),
    ("train", ["-m", "seed=0,1", "finding=nosuch"], 2, "job 0 of 2 (seed=0 finding=nosuch): finding='nosuch'"),
    ("train", ["model.attn.n_heads=five"], 2, "error: model.attn.n_heads='five'"),
    ("ablate", ["--list"], 0, "scan kind"),
    ("ablate", ["run_dir=RUN", "ablation.mode=zro"], 2, "error: ablation.mode='zro': allowed: "),
    ("ablate", ["model=tiny_random_llama", "data=pystdlib", "ablation.mode=zro"], 2, "error: ablation.mode='zro'"),
    ("report", ["NOSUCH"], 2, "holds no headcount runs"),
]


@pytest.mark.parametrize(
    ("command", "args", "exit_code", "said"), CASES, ids=[f"{c} {' '.join(a)}" for c, a, *_ in CASES]
)
def test_a_mistake_or_the_list_answers_before_torch_loads(tmp_path, command, args, exit_code, said):
    run = finished_looking_run(tmp_path / "run")
    args = [arg.replace("RUN", str(run)).replace("NOSUCH", str(tmp_path / "nosuch")) for arg in args]
    result, stdout, stderr = run_command(command, args, tmp_path)
    assert result["exit"] == exit_code, stderr
    said_where = stdout if exit_code == 0 else stderr
    assert said in said_where
    assert result["loaded"] == []
    assert sorted(p.name for p in run.iterdir()) == [".hydra", "checkpoints", "metrics.json"]  # nothing left there
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # nor a new (pretrained) run's folder


def test_the_probe_sees_torch_when_it_loads(tmp_path):
    """The check above can fail: a command that goes on to work (a report on a folder with a run) loads them."""
    run = tmp_path / "sweep" / "a=1"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text("- a=1\n")
    (run / ".hydra" / "config.yaml").write_text("seed: 0\n")
    result, _, stderr = run_command("report", [str(tmp_path / "sweep"), "--out", str(tmp_path / "out")], tmp_path)
    assert "torch" in result["loaded"] and "pandas" in result["loaded"], (result, stderr)
