"""Sweeps with Hydra multirun: each job finishes its own run directory; the same command again skips finished jobs and
resumes the rest; bad input fails before any job starts; the sweep folder is a pure function of the command."""

import re
import shlex
from pathlib import Path

import pandas as pd
import pytest
from sweep_helpers import SMOKE, compose_with_hydra, report_rows, run_dirs, run_python, train_in_process

from headcount.report.names import folder_name
from headcount.run_dir import RunPaths

REPO = Path(__file__).resolve().parents[1]
GRID_EXPERIMENT = """# @package _global_
experiment: grid2x2
hydra:
  sweeper:
    params:
      model.attn.n_heads: 1,2
      seed: 0,1
"""


@pytest.fixture(scope="module")
def grid_sweep(tmp_path_factory) -> tuple[Path, list[str]]:
    """A 2x2 grid (n_heads x seed) stored in an experiment file, run with the basic launcher: (sweep dir, the
    headcount-train arguments)."""
    root = tmp_path_factory.mktemp("grid")
    (root / "conf" / "experiment").mkdir(parents=True)
    (root / "conf" / "experiment" / "grid2x2.yaml").write_text(GRID_EXPERIMENT)
    args = ["-m", f"--config-dir={root / 'conf'}", "experiment=grid2x2", *SMOKE]
    args += ["ablation=single_head", "ablation.progress=false"]
    run_python(["-m", "headcount.cli.train", *args], cwd=root)
    return root / "outputs" / "multirun" / "grid2x2", args


def test_grid_from_an_experiment_file_finishes_four_runs_and_a_report(grid_sweep):
    sweep, _ = grid_sweep
    runs = run_dirs(sweep)
    # A job's folder is named by the keys swept, each by its last segment: short, shell-safe, and the same command
    # finds the same folders. The full overrides stay in the run's .hydra/overrides.yaml.
    assert [r.name for r in runs] == [f"n_heads={h},seed={seed}" for h in (1, 2) for seed in (0, 1)]
    assert "trainer=smoke" in (runs[0] / ".hydra" / "overrides.yaml").read_text()
    for run_dir in runs:
        paths = RunPaths(run_dir)
        assert paths.done.exists() and paths.metrics.exists() and (paths.ablation / "single_head.csv").exists()
    run_python([str(REPO / "scripts" / "report.py"), str(sweep)], cwd=sweep)
    rows = pd.read_csv(sweep / "report" / "runs.csv")
    assert len(rows) == 4 and set(rows["status"]) == {"finished"}
    assert sorted(zip(rows["model.attn.n_heads"], rows["seed"])) == [(1, 0), (1, 1), (2, 0), (2, 1)]


def test_rerun_skips_finished_jobs_and_resumes_interrupted_ones(grid_sweep, monkeypatch, capsys):
    sweep, args = grid_sweep
    runs = [RunPaths(r) for r in run_dirs(sweep)]
    mtimes = [p.last_ckpt.stat().st_mtime_ns for p in runs]
    interrupted_training, interrupted_ablation, *finished = runs
    # Training stopped after its last checkpoint, before metrics.json and DONE.
    interrupted_training.metrics.unlink()
    interrupted_training.done.unlink()
    # An ablation scan killed mid-write: no CSV yet, a truncated partial file, no DONE.
    scan = interrupted_ablation.ablation / "single_head.csv"
    before = pd.read_csv(scan)
    scan.unlink()
    (interrupted_ablation.ablation / "single_head.partial.csv").write_text("# fingerprint=")
    interrupted_ablation.done.unlink()

    # The same command again (in this process: the basic launcher runs every job in the process that started it).
    assert train_in_process(monkeypatch, sweep.parents[2], args) == 0
    assert capsys.readouterr().err.count("already finished") == 2
    assert [p.last_ckpt.stat().st_mtime_ns for p in finished] == mtimes[2:]  # finished jobs untouched
    assert all(p.done.exists() for p in runs) and interrupted_training.metrics.exists()
    pd.testing.assert_frame_equal(pd.read_csv(scan), before)
    assert not (interrupted_ablation.ablation / "single_head.partial.csv").exists()
    assert len(run_dirs(sweep)) == 4 and len(report_rows(sweep)) == 4  # nothing duplicated


@pytest.mark.parametrize(
    "sweep, message",
    [
        (["model.attn.n_head=1,2"], "model.attn.n_head=1: not a key of model.attn"),
        (["model.attn.n_heads=4,3"], "model.attn.n_heads=3: must divide"),
        (["seed=0,1", "logger=wandb", "logger.wandb.project=team/heads"], "logger.wandb.project='team/heads'"),
    ],
)
def test_bad_sweep_fails_in_one_line_before_any_job(monkeypatch, tmp_path, capsys, sweep, message):
    assert train_in_process(monkeypatch, tmp_path, ["-m", *SMOKE, *sweep]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "no job started" in err and len(err.splitlines()) == 1, err
    assert not list(tmp_path.glob("outputs/multirun/*/*/.hydra"))


@pytest.mark.parametrize(
    "sweep, parts",
    [
        (["ablation.mode=zero,bogus"], ("job 1 of 2 (", "ablation.mode=bogus): ablation.mode='bogus'")),
        # zero ablation needs no task, patching a task's corrupted prompts: only job 2 combines them wrongly
        (["ablation.mode=zero,resample,patch"], ("job 2 of 3 (", "ablation.mode=patch): ablation.mode='patch'")),
    ],
)
def test_a_sweep_whose_last_job_alone_is_wrong_fails_before_any_job_writes(monkeypatch, tmp_path, capsys, sweep, parts):
    """The pre-flight composes and plans every job before the first starts: job 0's training would otherwise run (and
    write its run folder, checkpoint and results) before job N's mistake is found."""
    assert train_in_process(monkeypatch, tmp_path, ["-m", *SMOKE, "ablation=single_head", *sweep]) == 2
    err = capsys.readouterr().err.strip()
    assert all(part in err for part in parts) and "no job started" in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "outputs").exists(), sorted(tmp_path.rglob("*"))  # no sweep folder, job folder or result


@pytest.mark.parametrize(
    "overrides, folder",
    [([], "outputs/multirun/sweep"), (["sweep_name=heads_vs_combine"], "outputs/multirun/heads_vs_combine")],
)
def test_sweep_folder_is_a_pure_function_of_the_command(overrides, folder):
    assert compose_with_hydra(overrides).hydra.sweep.dir == folder


def test_job_folders_are_named_by_the_swept_keys_short_and_shell_safe():
    """Once `ablation=[baseline,single_head,pruning],data=pystdlib,...,trainer.val_check_interval=150`: every
    override, brackets and commas included. Now the keys every job shares are excluded, keys are shortened to the
    segments that tell them apart, lists join by `+`, and anything a shell would read (spaces, slashes, quotes)
    becomes `_` with a short hash, so that two values never share a folder."""
    overrides = ["ablation=[baseline,single_head,pruning]", "data=pystdlib", "model.attn.n_heads=4", "seed=1"]
    overrides += ["trainer.val_check_interval=150", "data.path='/a b/c.txt'", "model.dropout=0.1"]
    overrides += ["trainer.optim.dropout=0"]
    name = folder_name(overrides, exclude=["data", "trainer.val_check_interval"])
    assert name == (
        "ablation=baseline+single_head+pruning,path=a_b_c.txt-ba4c01,n_heads=4,model.dropout=0.1,seed=1,optim.dropout=0"
    )
    assert re.fullmatch(r"[A-Za-z0-9._+=,-]+", name) and shlex.quote(name) == name
    assert folder_name(["data.path='/a b/c.txt'"]) != folder_name(["data.path='/a_b/c.txt'"])
    assert folder_name(["ablation=[]"]) == "ablation=empty" and folder_name(["seed=1"], exclude=["seed"]) == "run"
