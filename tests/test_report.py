"""Sweep reports from files alone: a hand-made sweep of 2 configurations x 2 seeds, one run left unfinished."""

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from headcount.cli.report import main
from headcount.report.sweep_report import print_summary, write_report
from headcount.run_dir import RunPaths

COLUMNS = ["scan", "mask", "layer", "head", "mode", "loss", "acc", "delta_loss", "delta_acc", "n_heads_off"]


def make_run(sweep: Path, n_heads: int, seed: int, finished: bool = True) -> Path:
    """A run directory as training and the ablation engine leave it (checkpoints aside)."""
    overrides = ["model=tiny", f"model.attn.n_heads={n_heads}", f"seed={seed}"]
    run_dir = sweep / ",".join(sorted(overrides))
    paths = RunPaths(run_dir)
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    (run_dir / ".hydra" / "config.yaml").write_text(yaml.safe_dump({"logger": {"wandb": {"project": "heads"}}}))
    loss = 2.0 - 0.1 * n_heads + 0.01 * seed
    metrics = {"val/loss": loss, "val/acc": 0.5, "test/loss": loss, "test/acc": 0.5, "params": 1000 + n_heads}
    paths.metrics.write_text(json.dumps(metrics))
    paths.ablation.mkdir()
    rows = [
        ("single_head", f"L{l}H{h}", l, h, "zero", loss + 0.1, 0.4, 0.1 * h, -0.1, 1)
        for l in range(2)
        for h in range(n_heads)
    ]
    pd.DataFrame(rows, columns=COLUMNS).to_csv(paths.ablation / "single_head.csv", index=False)
    curves = [("gradient", seed, f, round(f * 2 * n_heads), loss + f, 0.5, f) for f in (0.0, 0.5, 1.0)]
    columns = ["order", "seed", "fraction", "n_pruned", "loss", "acc", "delta_loss"]
    pd.DataFrame(curves, columns=columns).to_csv(paths.ablation / "pruning.csv", index=False)
    summary = {
        "baseline_loss": loss,
        "baseline_acc": 0.5,
        "prunable_fraction": {"gradient": 0.25 * n_heads},
        "most_important_head": {"mask": f"L1H{n_heads - 1}", "layer": 1, "head": n_heads - 1, "delta_loss": 0.3},
    }
    (paths.ablation / "summary.json").write_text(json.dumps(summary))
    if finished:
        paths.done.write_text("")
    return run_dir


@pytest.fixture
def sweep(tmp_path) -> Path:
    sweep = tmp_path / "multirun" / "heads"
    for n_heads in (1, 2):
        for seed in (0, 1):
            make_run(sweep, n_heads, seed, finished=(n_heads, seed) != (2, 1))
    (sweep / ".submitit" / "123").mkdir(parents=True)  # launcher files are not runs
    return sweep


def test_report_tables_and_figures(sweep):
    out, runs, figures = write_report(sweep)
    assert out == sweep / "report"
    table = pd.read_csv(out / "runs.csv")
    assert len(table) == 4
    assert {"model.attn.n_heads", "seed", "params", "test/loss", "prunable_fraction/gradient", "status"} <= set(table)
    assert table["status"].value_counts().to_dict() == {"finished": 3, "unfinished": 1}
    unfinished = table[table["status"] == "unfinished"].iloc[0]
    assert (unfinished["model.attn.n_heads"], unfinished["seed"]) == (2, 1)
    names = {p.name for p in figures.values()}
    assert names == {"metrics_vs_model.attn.n_heads.png", "pruning_curves.png", "single_head_heatmaps.png"}
    assert all((out / name).stat().st_size > 0 for name in names)
    markdown = (out / "report.md").read_text()
    assert "4 runs, 3 finished, 1 unfinished" in markdown
    assert "`model.attn.n_heads` (1, 2), `seed` (0, 1)" in markdown
    assert all(f"]({name})" in markdown for name in names)
    # Means over seeds leave the unfinished run out: n_heads=2 has one finished run, loss 2.0 - 0.2.
    means = markdown.split("## Mean over seeds")[1].split("## Runs")[0]
    assert "| 1 | 2 | 1001 ± 0 | 1.905 ± 0.0071 | 0.5 ± 0 | 0.25 ± 0 |" in means
    assert "| 2 | 1 | 1002 | 1.8 | 0.5 | 0.5 |" in means


def test_a_task_sweep_in_patch_mode_titles_its_single_head_figure_by_its_metric(tmp_path):
    """A sweep of task runs in patch mode titled its single-head section "loss increase"."""
    sweep = tmp_path / "multirun" / "patch"
    for seed in (0, 1):
        run_dir = make_run(sweep, 2, seed)
        config = {"ablation": {"mode": "patch", "metric": "logit_diff"}, "task": {"source": "file", "path": "p.jsonl"}}
        (run_dir / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
        folder = RunPaths(run_dir).ablation / "tasks" / "p"
        folder.mkdir(parents=True)
        rows = [("single_head", f"L0H{h}", 0, h, "patch", "logit_diff", 1.0, -0.5 * h, 1) for h in range(2)]
        columns = ["scan", "mask", "layer", "head", "mode", "metric", "logit_diff", "delta_logit_diff", "n_heads_off"]
        pd.DataFrame(rows, columns=columns).to_csv(folder / "single_head.patch.logit_diff.csv", index=False)
    _, _, figures = write_report(sweep)
    titles = [title for title in figures if title.startswith("Single-head")]
    assert titles == ["Single-head ablation (change in logit_diff (logits) with each head off alone, patch ablation)"]


def test_cli_prints_a_summary_and_rerun_overwrites(sweep, capsys):
    main([str(sweep)])
    first = (sweep / "report" / "runs.csv").read_text()
    main([str(sweep)])
    assert (sweep / "report" / "runs.csv").read_text() == first
    assert "4 runs" in capsys.readouterr().err


@pytest.mark.parametrize("folder", ["empty", "missing"])
def test_a_folder_without_runs_is_one_line_and_exit_2(tmp_path, capsys, folder):
    path = tmp_path / folder
    if folder == "empty":
        path.mkdir()
    with pytest.raises(SystemExit) as exit_info:
        main([str(path)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "holds no headcount runs" in err and len(err.splitlines()) == 1, err
    assert not (path / "report").exists()


def test_report_to_wandb_offline(sweep, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    main([str(sweep), "--wandb"])
    (offline_run,) = (sweep / "report" / "wandb").glob("offline-run-*")
    assert list((offline_run / "files" / "media" / "table" / "report").glob("runs_*.table.json"))
    assert list((offline_run / "files" / "media" / "images" / "report").glob("pruning_curves_*.png"))


def test_bad_wandb_project_for_the_report(sweep, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([str(sweep), "--wandb", "--project", "a/b"])
    assert exit_info.value.code == 2
    assert "logger.wandb.project='a/b'" in capsys.readouterr().err


def test_ablate_logs_inside_a_run_are_not_runs(tmp_path):
    from headcount.report.runs import find_runs

    for run in ("a=1", "a=2"):
        (tmp_path / run / ".hydra").mkdir(parents=True)
        (tmp_path / run / ".hydra" / "overrides.yaml").write_text("- a=1\n")
        logs = tmp_path / run / "ablation" / "logs" / "2026-01-01_00-00-00" / ".hydra"
        logs.mkdir(parents=True)
        (logs / "overrides.yaml").write_text("- run_dir=x\n")
    assert find_runs(tmp_path) == [tmp_path / "a=1", tmp_path / "a=2"]


def test_the_terminal_table_fits_80_columns_with_a_legend_and_whole_values(capsys, tmp_path, monkeypatch):
    """12 runs swept over long keys: the table once cut every name to the same prefix at 80 columns."""
    monkeypatch.delenv("COLUMNS", raising=False)
    swept = ["model.attn.n_heads", "trainer.val_check_interval", "ablation.scans.pruning.step", "data.path"]
    rows = [
        {"run": f"r{i}", "status": "finished" if i % 3 else "unfinished", "model.attn.n_heads": 2 ** (i % 4)}
        | {"trainer.val_check_interval": 150 * (i // 4 + 1), "ablation.scans.pruning.step": 0.05}
        | {"data.path": f"/data/corpora/python_stdlib_{i:02d}.txt", "params": 1000, "test/loss": 2.0 + i / 100}
        for i in range(12)
    ]
    print_summary(tmp_path / "report", pd.DataFrame(rows, columns=["run", "status", *swept, "params", "test/loss"]))
    err = capsys.readouterr().err
    table = [line for line in err.splitlines() if line[:1] in "┏┃┡│└"]
    assert len(table) > 12 and max(len(line) for line in table) <= 80, err
    legend = "columns: n_heads = model.attn.n_heads, val_check_interval = trainer.val_check_interval, path = data.path"
    assert legend in err
    assert "step" not in "".join(table)  # the same in every run: no column
    cells = "".join(line.split("│")[3] for line in table if line.startswith("│"))
    for i in range(12):  # values wrap rather than being cut
        assert f"/data/corpora/python_stdlib_{i:02d}.txt" in cells.replace(" ", ""), cells
