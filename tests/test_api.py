"""The Python API (headcount/api.py): a finished run opened in eval mode, masks evaluated with the scans' numbers,
scans run by name, results read back as pandas tables with their mode."""

import hashlib
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf
from torch.nn import functional as F

import headcount
from headcount import run_lock
from headcount.ablation.engine.masks import HeadMask
from headcount.cli.train import run as train
from headcount.config import CONF_DIR
from headcount.errors import ConfigError
from headcount.model.intervention import gated
from headcount.run_dir import RunPaths
from headcount.run_dir import load_run as open_finished_run

SMOKE = ["model=tiny", "data=induction", "trainer=smoke", "logger=none", "ablation.progress=false"]
SMOKE += ["data.n_train=64", "data.n_val=24", "data.n_test=16", "data.seq_len=32", "ablation.n_reference=16"]
SMOKE += ["ablation.batch_size=10"]  # three eval batches, the last one short


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A smoke-trained run that ran the single_head scan, with the .hydra/config.yaml headcount-train leaves."""
    run_dir = tmp_path_factory.mktemp("api") / "run"
    GlobalHydra.instance().clear()
    with initialize_config_dir(CONF_DIR, version_base="1.3"):
        cfg = compose("train", overrides=[*SMOKE, "ablation=[baseline,single_head]"])
    train(cfg, run_dir)
    RunPaths(run_dir).config.parent.mkdir()
    OmegaConf.save(cfg, RunPaths(run_dir).config)
    return run_dir


@pytest.fixture(scope="module")
def run(run_dir) -> headcount.Run:
    return headcount.load_run(run_dir, device="cpu")


def test_load_run_gives_the_model_in_eval_mode_with_its_config_and_batches(run, run_dir):
    assert isinstance(run, headcount.Run)
    assert not run.model.training and all(not m.training for m in run.model.modules())
    assert next(run.model.parameters()).dtype == torch.float32
    assert run.config.model.attn.n_heads == 4
    finished = open_finished_run(run_dir)
    expected = finished.eval_batches()
    assert [len(b["input_ids"]) for b in run.eval_batches] == [10, 10, 4]
    for batch, want in zip(run.eval_batches, expected):
        assert torch.equal(batch["input_ids"], want["input_ids"]) and torch.equal(batch["loss_mask"], want["loss_mask"])
    assert run.metrics["test/loss"] > 0


@pytest.mark.parametrize("mode", ["zero", "mean", "resample"])
def test_evaluate_gives_the_scans_numbers(run, mode):
    scanned = run.scan("single_head", mode=mode).set_index("mask")
    heads = list(scanned.index)
    evaluated = run.evaluate(heads[::-1], mode=mode).set_index("mask").loc[heads]
    for column in ["loss", "acc", "delta_loss", "delta_acc"]:
        torch.testing.assert_close(
            torch.tensor(evaluated[column].to_numpy()), torch.tensor(scanned[column].to_numpy()), rtol=1e-6, atol=1e-9
        )
    same = ["layer", "head", "mode", "n_heads_off", "split", "n_eval", "n_targets", "reference_split", "n_reference"]
    pd.testing.assert_frame_equal(evaluated[same], scanned[same], check_dtype=False)


def plain_loss_and_accuracy(model, batches, gates_LH) -> tuple[float, float]:
    """Next-token loss and accuracy per target token over the batches, from the model's own forward pass with the
    given head gates: cross-entropy and argmax written out here, nothing of headcount's evaluation."""
    nll, hits, count = 0.0, 0.0, 0
    with torch.no_grad():
        for batch in batches:
            logits = model(batch["input_ids"], None if gates_LH is None else gated(gates_LH))[:, :-1].double()
            targets, marked = batch["input_ids"][:, 1:], batch["loss_mask"][:, 1:].bool()
            nll += F.cross_entropy(logits[marked], targets[marked], reduction="sum").item()
            hits += (logits[marked].argmax(-1) == targets[marked]).sum().item()
            count += int(marked.sum())
    return nll / count, hits / count


def test_evaluate_in_zero_mode_is_a_plain_forward_with_the_heads_gated_off(run):
    masks = {"one": [(0, 1)], "two layers": [(0, 2), (1, 3)], "a layer": [(1, h) for h in range(4)], "none": []}
    table = run.evaluate(masks, mode="zero").set_index("mask")
    base_loss, base_acc = plain_loss_and_accuracy(run.model, run.eval_batches, None)
    for name, heads in masks.items():
        gates_LH = torch.ones(run.model.n_layers, run.model.max_heads)
        for layer, head in heads:
            gates_LH[layer, head] = 0.0
        loss, acc = plain_loss_and_accuracy(run.model, run.eval_batches, gates_LH)
        row = table.loc[name]
        assert row["loss"] == pytest.approx(loss, rel=1e-5) and row["acc"] == pytest.approx(acc, abs=1e-9)
        assert row["delta_loss"] == pytest.approx(loss - base_loss, rel=1e-4, abs=1e-6)
        assert row["delta_acc"] == pytest.approx(acc - base_acc, abs=1e-9)
    assert table.loc["a layer", "delta_loss"] > 0.0  # the comparison is not between two unchanged models


def test_evaluate_takes_masks_in_every_form(run):
    table = run.evaluate(
        {"pair": [(0, 1), "L1H2"], "by name": "L0H1+L1H2", "mask": HeadMask("x", ((0, 1), (1, 2))), "none": []},
        mode="zero",
    )
    assert list(table["mask"]) == ["pair", "by name", "mask", "none"]
    assert list(table["n_heads_off"]) == [2, 2, 2, 0]
    assert table["loss"].iloc[:3].nunique() == 1
    assert table["delta_loss"].iloc[3] == 0
    assert list(run.evaluate(["L1H3", [(0, 0), (0, 2)]])["mask"]) == ["L1H3", "L0H0+L0H2"]


@pytest.mark.parametrize(
    "masks, message",
    [
        (["L5H0"], "no such layer"),
        ([[(0, 9)]], "no such head"),
        (["head three"], "a head is a (layer, head) pair"),
        ([], "at least one mask"),
        (["L0H1", [(0, 1)]], "distinct name"),
        (["L0H3+"], "masks='L0H3+': an empty head name beside a"),
    ],
)
def test_bad_masks_are_config_errors(run, masks, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace("+", r"\+")):
        run.evaluate(masks)


def every_file(directory: Path) -> dict[str, str]:
    """Every file under a directory, at any depth, with the sha256 of its bytes."""
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in directory.rglob("*")
        if p.is_file()
    }


def test_evaluate_writes_nothing(run, run_dir):
    before = every_file(run_dir)
    run.evaluate(["L0H0"], mode="mean")
    run.evaluate(["L0H0"], mode="zero")
    assert every_file(run_dir) == before  # no file added, removed or changed, in any folder of the run


def test_results_are_tables_with_a_mode_column(run):
    run.scan("single_head", mode="mean")
    both = run.results("single_head")
    assert {"zero", "mean"} <= set(both["mode"])
    modes = sorted(set(both["mode"]))
    assert len(both) == sum(len(run.results("single_head", mode=mode)) for mode in modes)
    assert set(run.results("single_head", mode="mean")["mode"]) == {"mean"}
    by_mode = both.pivot(index="mask", columns="mode", values="delta_loss")
    assert list(by_mode.columns) == modes and len(by_mode) == 8
    index = run.results_index()
    assert {("single_head", "zero"), ("single_head", "mean"), ("baseline", "zero")} <= set(
        zip(index["scan"], index["mode"])
    )
    assert run.summary("zero")["baseline_loss"] == pytest.approx(run.results("baseline")["loss"].iloc[0])


def test_results_of_a_scan_not_run_say_what_is_there(run):
    with pytest.raises(ConfigError, match="run.scan computes them; done: .*single_head"):
        run.results("layer")
    with pytest.raises(ConfigError, match="allowed: zero, mean, resample, patch"):
        run.evaluate(["L0H0"], mode="half")


@pytest.mark.parametrize("task, name", [("nosuchtask", "nosuchtask"), ("data/prompts.jsonl", "prompts")])
def test_results_and_summary_of_a_task_without_results_say_which_tasks_have_them(run, task, name):
    """run.summary(task="nosuchtask") returned {}, and run.results(task=<prompts file>) looked for results "in" the
    file: a file names its folder by its stem, and a folder that is not there is one line listing those that are."""
    for read in (lambda: run.summary("zero", task=task), lambda: run.results("single_head", task=task)):
        with pytest.raises(ConfigError) as error:
            read()
        assert str(error.value).startswith(f"task={name!r}: has no results folder in "), error.value
        assert "(tasks with results: none;" in str(error.value)


def test_a_task_mapping_with_an_unknown_key_is_one_line(run):
    """task={"pth": ...} was OmegaConf's ConfigKeyError over several lines."""
    with pytest.raises(ConfigError) as error:
        run.evaluate(["L0H0"], task={"source": "file", "pth": "p.jsonl"})
    assert str(error.value).startswith("task.pth='p.jsonl': no such task key; allowed: source, name,"), error.value
    assert "\n" not in str(error.value)


def test_scan_runs_a_kind_with_scan_settings_releases_the_lock_and_reads_back(run, run_dir, capsys):
    pairs = run.scan("pairs", top_k=3)
    assert len(pairs) == 3 and set(pairs["scan"]) == {"pairs"}
    assert not run_lock.holds(run_dir)
    again = run.scan("pairs", top_k=3)
    assert "up to date" in capsys.readouterr().err
    pd.testing.assert_frame_equal(again, pairs)


def test_top_heads_by_two_rankings_keeps_two_tables(run, run_dir, capsys):
    """rank_by changes which heads go: its tables were one file, the second ranking's replacing the first's."""
    by_default = run.scan("top_heads", top_fraction=0.25, random_sets=1)
    by_importance = run.scan("top_heads", top_fraction=0.25, random_sets=1, rank_by="importance")
    ablation = RunPaths(run_dir).ablation
    assert (ablation / "top_heads.csv").exists() and (ablation / "top_heads.zero.by_importance.csv").exists()
    assert by_default["mask"].iloc[0].startswith("top 2 by single_head")
    assert by_importance["mask"].iloc[0].startswith("top 2 by importance")
    capsys.readouterr()
    pd.testing.assert_frame_equal(run.scan("top_heads", top_fraction=0.25, random_sets=1), by_default)
    assert "up to date" in capsys.readouterr().err  # the second ranking did not supersede the first
    pd.testing.assert_frame_equal(run.results("top_heads", variant=""), by_default)
    pd.testing.assert_frame_equal(run.results("top_heads", variant="by_importance"), by_importance)
    assert len(run.results("top_heads")) == len(by_default) + len(by_importance)
    index = run.results_index()
    assert set(index[index["scan"] == "top_heads"]["variant"]) == {"", "by_importance"}


def test_a_ranking_recorded_under_the_plain_name_before_takes_its_own(run_dir, tmp_path, capsys):
    """A top_heads table ranked by another scan, written before rankings had names of their own, sat in top_heads.csv
    as if ranked by single_head: it takes its own name (its fingerprint holds its rank_by), not computed again."""
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    run = headcount.load_run(copy, device="cpu")
    settings = {"top_fraction": 0.25, "random_sets": 1, "rank_by": "importance"}
    table = run.scan("top_heads", **settings)
    ablation, summary_path = RunPaths(copy).ablation, RunPaths(copy).ablation / "summary.json"
    summary = json.loads(summary_path.read_text())
    scans = summary["modes"]["zero"]["scans"]
    scans.pop("top_heads", None)
    entry = scans.pop("top_heads.by_importance")
    for name in entry["files"]:  # as written before: plain names, no variant
        (ablation / name).replace(ablation / name.replace(".zero.by_importance", ""))
    entry = {k: v for k, v in entry.items() if k not in ("scan", "variant")}
    scans["top_heads"] = {**entry, "files": [name.replace(".zero.by_importance", "") for name in entry["files"]]}
    summary_path.write_text(json.dumps(summary))
    capsys.readouterr()
    pd.testing.assert_frame_equal(run.scan("top_heads", **settings), table)
    err = capsys.readouterr().err
    assert "holds top_heads.by_importance's result" in err and "up to date" in err, err
    assert not (ablation / "top_heads.csv").exists() and (ablation / "top_heads.zero.by_importance.png").exists()
    assert list(run.results_index().query("scan == 'top_heads'")["variant"]) == ["by_importance"]
