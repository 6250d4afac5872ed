"""Records that say what ran (issue 21): a finished run keeps its config, a resume under other settings is refused
unless asked for (and then recorded), result tables are never trusted past what summary.json recorded of them, empty
results never replace real ones, a rerun after the scans were killed adds no training rows, a scan recomputed under
other settings leaves a superseded record, and settings that would run something else than recorded are refused."""

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch
from sweep_helpers import SMOKE, command_in_process, one_line, train_in_process

from headcount import api
from headcount.ablation.records import results as results_module
from headcount.cli import ablate as ablating
from headcount.errors import ConfigError
from headcount.run_dir import RunPaths

QUIET = ["ablation.progress=false", "trainer.progress_bar=false"]
SHORT = ["trainer.max_steps=8", "trainer.val_check_interval=8", "trainer.checkpoint_every_n_steps=4"]


def train(monkeypatch, root: Path, *args: str) -> int:
    return train_in_process(monkeypatch, root, [*SMOKE, *QUIET, *SHORT, "hydra.run.dir=run", *args])


def ablate(monkeypatch, root: Path, *args: str) -> int:
    return command_in_process(ablating.main, monkeypatch, root, [f"run_dir={root / 'run'}", *QUIET[:1], *args])


@pytest.fixture(scope="module")
def done_run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("records")
    mp = pytest.MonkeyPatch()
    try:
        assert (
            train(
                mp,
                root,
                "ablation=[baseline,single_head,custom]",
                f"ablation.scans.custom.masks_file={masks(root, 'a')}",
            )
            == 0
        )
    finally:
        mp.undo()
    return root / "run"


def masks(root: Path, name: str) -> Path:
    path = root / f"{name}.yaml"
    path.write_text("- [[0, 0]]\n" if name == "a" else "- [[1, 1], [0, 1]]\n")
    return path


@pytest.fixture
def run_root(done_run, tmp_path) -> Path:
    shutil.copytree(done_run, tmp_path / "run")
    shutil.copy(done_run.parent / "a.yaml", tmp_path / "a.yaml")
    return tmp_path


def test_a_finished_run_started_again_with_other_settings_keeps_its_config(run_root, monkeypatch, capsys):
    saved = (run_root / "run" / ".hydra" / "config.yaml").read_text()
    overrides = (run_root / "run" / ".hydra" / "overrides.yaml").read_text()
    assert train(monkeypatch, run_root, "model.attn.n_heads=2", "ablation=[baseline]") == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith("error: hydra.run.dir=") and "model.attn.n_heads" in line, line
    assert (run_root / "run" / ".hydra" / "config.yaml").read_text() == saved
    assert (run_root / "run" / ".hydra" / "overrides.yaml").read_text() == overrides
    # the same settings again: already finished, and nothing rewritten (other scans are headcount-ablate's job)
    assert train(monkeypatch, run_root, "ablation=[baseline]") == 0
    assert "already finished" in capsys.readouterr().err
    assert (run_root / "run" / ".hydra" / "overrides.yaml").read_text() == overrides


def interrupted(root: Path) -> Path:
    """The finished run made unfinished: killed after its checkpoint at step 4, before its end."""
    paths = RunPaths(root / "run")
    paths.done.unlink()
    paths.metrics.unlink()
    return paths.root


def test_a_resume_under_other_settings_is_refused_unless_asked_for_and_then_recorded(run_root, monkeypatch, capsys):
    run_dir = interrupted(run_root)
    saved = (run_dir / ".hydra" / "config.yaml").read_text()
    assert train(monkeypatch, run_root, "trainer.optim.lr=0.01", "ablation=[baseline]") == 2
    line = one_line(capsys.readouterr().err)
    assert "trainer.optim.lr" in line and "allow_changes=true" in line, line
    assert (run_dir / ".hydra" / "config.yaml").read_text() == saved and not RunPaths(run_dir).done.exists()
    assert train(monkeypatch, run_root, "trainer.optim.lr=0.01", "ablation=[baseline]", "allow_changes=true") == 0
    changes = json.loads((run_dir / "config_changes.json").read_text())
    assert changes[-1]["changed"]["trainer.optim.lr"][1] == 0.01 and "at_step" in changes[-1]


def test_a_table_that_does_not_match_its_record_is_never_up_to_date(run_root, monkeypatch, capsys):
    """kill -9 between a scan's CSV replace and its summary.json update, or a CSV cut short: the table no longer
    matches what summary.json recorded, so it is computed again, and readers refuse it meanwhile."""
    csv = RunPaths(run_root / "run").ablation / "single_head.csv"
    good = pd.read_csv(csv)
    csv.write_text(csv.read_text()[: len(csv.read_text()) // 2])  # cut short
    with pytest.raises(ConfigError, match="does not match what summary.json recorded"):
        api.load_run(run_root / "run").results("single_head")
    assert ablate(monkeypatch, run_root, "ablation=single_head") == 0
    err = capsys.readouterr().err
    assert "up to date" not in err and "computing it again" in err
    pd.testing.assert_frame_equal(pd.read_csv(csv), good)
    csv.write_text(csv.read_text().replace("single_head,L0H0", "single_head,L0H0 "))  # the same length, other bytes
    assert ablate(monkeypatch, run_root, "ablation=single_head") == 0
    assert "computing it again" in capsys.readouterr().err


def test_empty_pruning_orders_are_refused_before_any_write(run_root, monkeypatch, capsys):
    before = {p: p.read_bytes() for p in RunPaths(run_root / "run").ablation.glob("*") if p.is_file()}
    assert ablate(monkeypatch, run_root, "ablation=pruning", "ablation.pruning.orders=[]") == 2
    assert one_line(capsys.readouterr().err).startswith("error: ablation.pruning.orders=[]")
    after = {p: p.read_bytes() for p in RunPaths(run_root / "run").ablation.glob("*") if p.is_file()}
    assert after == before


def test_an_empty_table_never_replaces_a_result(run_root, monkeypatch, capsys):
    from headcount.ablation.scans.single_head import SingleHeadScan

    csv = RunPaths(run_root / "run").ablation / "single_head.csv"
    before = csv.read_bytes()
    monkeypatch.setattr(SingleHeadScan, "masks", lambda self: [])
    assert ablate(monkeypatch, run_root, "ablation=single_head", "ablation.seed=1") == 2
    assert "computed no rows" in one_line(capsys.readouterr().err)
    assert csv.read_bytes() == before


def test_a_second_masks_file_supersedes_the_first_custom_result(run_root, monkeypatch):
    other = masks(run_root, "b")
    assert ablate(monkeypatch, run_root, "ablation=custom", f"ablation.scans.custom.masks_file={other}") == 0
    summary = json.loads((RunPaths(run_root / "run").ablation / "summary.json").read_text())
    superseded = [entry for entry in summary.get("superseded", []) if entry.get("scan") == "custom"]
    assert len(superseded) == 1 and superseded[0]["rows"] == 1 and "custom" in superseded[0]["reason"]


def test_a_rerun_after_the_scans_were_killed_adds_no_training_rows(run_root, monkeypatch):
    """Training finished (metrics.json written), then the scans were killed: the rerun runs only what is left."""
    paths = RunPaths(run_root / "run")
    paths.done.unlink()
    rows = (paths.root / "logs" / "metrics.csv").read_text()
    metrics = json.loads(paths.metrics.read_text())
    assert (
        train(
            monkeypatch, run_root, "ablation=[baseline,single_head,custom]", "ablation.scans.custom.masks_file=a.yaml"
        )
        == 0
    )
    assert (paths.root / "logs" / "metrics.csv").read_text() == rows
    assert json.loads(paths.metrics.read_text()) == metrics and paths.done.exists()


def test_train_seconds_add_up_over_a_resumed_run(tmp_path, monkeypatch):
    """Stopped after its step-4 checkpoint and resumed: metrics.json counts both processes' training."""
    from headcount.train import checkpointing

    assert train(monkeypatch, tmp_path, "ablation=[]", "trainer.max_steps=4", "trainer.val_check_interval=4") == 0
    first = json.loads(RunPaths(tmp_path / "run").metrics.read_text())
    ckpt = torch.load(RunPaths(tmp_path / "run").last_ckpt, weights_only=False)
    assert ckpt["train_seconds"] > 0 and checkpointing is not None
    assert first["train_seconds"] >= ckpt["train_seconds"] and first["tokens_per_second"] > 0


@pytest.mark.parametrize(
    "args, message",
    [
        (["trainer.precision=16-mixed"], "trainer.precision='16-mixed': float16 autocast needs a GPU"),
        (["seed=4294967296"], "seed=4294967296: must be an integer in 0..4294967295"),
        (["seed=-1"], "seed=-1: must be an integer in 0..4294967295"),
        (["-m", "seed=0,4294967296"], "job 1 of 2 ("),
    ],
)
def test_settings_that_would_run_something_else_are_refused_first(tmp_path, monkeypatch, capsys, args, message):
    flags = [arg for arg in args if arg == "-m"]
    assert train_in_process(monkeypatch, tmp_path, [*flags, *SMOKE, *QUIET, *(a for a in args if a != "-m")]) == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith(f"error: {message}") and ("must be an integer in" in line or "16-mixed" in line), line
    assert not (tmp_path / "outputs").exists()


def test_readers_check_tables_against_their_record(run_root):
    csv = RunPaths(run_root / "run").ablation / "single_head.csv"
    csv.write_text(csv.read_text() + "single_head,L9H9,9,9,zero,1,1,1,1,1,loss,val,1,1,,\n")
    with pytest.raises(ConfigError, match="does not match what summary.json recorded"):
        results_module.read_checked(csv)
