"""Running headcount-train as a user would, for the sweep and launcher tests: in a subprocess or in this process."""

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig

from headcount.cli import ablate as ablating
from headcount.cli import train as training
from headcount.config import CONF_DIR
from headcount.report.sweep_report import write_report
from headcount.run_dir import RunPaths

SMOKE = ["model=tiny", "data=induction", "trainer=smoke", "data.n_train=64", "data.n_val=32", "data.n_test=32"]


def run_python(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """`python <args>` from cwd, one thread per process (the machine's cores are shared); it must succeed."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def run_dirs(sweep: Path) -> list[Path]:
    """The run directories of a multirun folder."""
    return sorted(p.parent.parent for p in sweep.glob("*/.hydra/overrides.yaml"))


def command_in_process(main, monkeypatch, cwd: Path, args: list[str]) -> int:
    """A command's main(), with <args> as its command line, in this process, from cwd; returns its exit code."""
    monkeypatch.chdir(cwd)
    monkeypatch.setattr(sys, "argv", ["headcount", *args])
    GlobalHydra.instance().clear()
    try:
        main()
    except SystemExit as e:
        return e.code
    return 0


def train_in_process(monkeypatch, cwd: Path, args: list[str]) -> int:
    """headcount-train <args> in this process, from cwd; returns its exit code."""
    return command_in_process(training.main, monkeypatch, cwd, args)


def one_line(err: str) -> str:
    """The one line a refused command printed (and no traceback)."""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def compose_with_hydra(overrides: list[str]) -> DictConfig:
    """The train config with its hydra node, as `headcount-train <overrides>` composes it."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(CONF_DIR, version_base="1.3"):
        return compose("train", overrides=overrides, return_hydra_config=True)


def report_rows(sweep: Path) -> pd.DataFrame:
    """runs.csv of a fresh report on the sweep."""
    write_report(sweep)
    return pd.read_csv(sweep / "report" / "runs.csv")


def smoke_run(monkeypatch_factory, root: Path, extra: list[str] = ()) -> Path:
    """A smoke run trained by headcount-train in this process (its baseline scan only), in root/run."""
    mp = monkeypatch_factory()
    try:
        args = [*SMOKE, "ablation.progress=false", "trainer.progress_bar=false", "ablation=[baseline]", *extra]
        assert train_in_process(mp, root, [*args, "hydra.run.dir=run"]) == 0
    finally:
        mp.undo()
    return root / "run"


def ablate_unchanged(run_dir: Path, monkeypatch, args: list[str]) -> tuple[int, bool]:
    """headcount-ablate on run_dir with <args> in this process: its exit code, and whether the run's ablation folder
    holds the same files as before, its logs aside (a refused command must leave nothing behind)."""
    ablation = RunPaths(run_dir).ablation

    def files() -> list[Path]:
        return sorted(p for p in ablation.rglob("*") if "logs" not in p.parts)

    before = files()
    code = command_in_process(ablating.main, monkeypatch, run_dir.parent, [f"run_dir={run_dir}", *args])
    return code, files() == before
