"""Results that coexist, carry their provenance and can be trusted: each test reproduces a fault once observed.

1. A second mode overwrote the first mode's files and summary.json. 2. Data changed since training silently changed
later results; a damaged cache entry failed with an OSError. 3. A moved run directory recomputed scans that were up
to date. 4. One head per layer made every normalised importance 1. 5. An export with nothing to remove wrote a
"pruned" model silently. 6. Figures hid the tolerance line and did not say what they showed. 7. Result files did not
record the mode, the splits and their sizes.
"""

import json
import logging
import shutil
import subprocess
import sys
from pathlib import Path

import matplotlib.figure
import pandas as pd
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from headcount.ablation import export as export_module
from headcount.ablation.engine.evaluator import MaskEvaluator
from headcount.ablation.methods.importance import gradient_importance
from headcount.ablation.methods.pruning import pruning_curves
from headcount.ablation.records.results import RECORD_COLUMNS
from headcount.ablation.records.summary import read_mode_summary
from headcount.cli.ablate import ablate, typed_ablation_keys
from headcount.cli.train import run
from headcount.config import CONF_DIR
from headcount.config.ablation import PruningConfig
from headcount.data import DataConfig, build_splits
from headcount.errors import ConfigError
from headcount.model import AttentionConfig, ModelConfig, Transformer
from headcount.report.sweep_report import ARBITRARY_NOTE, report_markdown
from headcount.report.tracking import summary_headline
from headcount.run_dir import RunPaths

TINY = ["model=tiny", "trainer=smoke", "logger=none", "ablation.progress=false"]
INDUCTION = ["data=induction", "data.n_train=64", "data.n_val=24", "data.n_test=16", "data.seq_len=32"]


def compose_config(name: str, overrides: list[str]):
    GlobalHydra.instance().clear()
    with initialize_config_dir(CONF_DIR, version_base="1.3"):
        return compose(name, overrides=overrides)


def train_run(run_dir: Path, overrides: list[str]) -> Path:
    """A smoke-trained run with the .hydra/config.yaml that `headcount-train` leaves (and the preset choice that
    Hydra records in .hydra/hydra.yaml)."""
    cfg = compose_config("train", TINY + overrides)
    run(cfg, run_dir)
    RunPaths(run_dir).config.parent.mkdir(exist_ok=True)
    OmegaConf.save(cfg, RunPaths(run_dir).config)
    OmegaConf.save({"hydra": {"runtime": {"choices": {"model": "tiny"}}}}, run_dir / ".hydra" / "hydra.yaml")
    return run_dir


def ablate_with(run_dir: Path, *overrides: str) -> list[Path]:
    overrides = (f"run_dir={run_dir}", "ablation.progress=false", *overrides)
    return ablate(compose_config("ablate", list(overrides)), typed_ablation_keys(overrides))


def count_mask_passes(monkeypatch) -> list[int]:
    calls: list[int] = []
    real = MaskEvaluator.accumulate
    monkeypatch.setattr(MaskEvaluator, "accumulate", lambda self, *a, **k: calls.append(1) or real(self, *a, **k))
    return calls


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory) -> Path:
    """Trained with zero-mode single_head, layer and pruning scans and a pruned export at half the heads."""
    run_dir = tmp_path_factory.mktemp("faults") / "run"
    scans = ["ablation=[single_head,layer,pruning]", "ablation.pruning.orders=[gradient,random]"]
    return train_run(run_dir, INDUCTION + scans + ["ablation.prune.export=true", "ablation.prune.fraction=0.5"])


@pytest.fixture
def run_copy(trained_run, tmp_path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(trained_run, copy)
    return copy


# --- 1. every mode's results coexist ------------------------------------------------------------------------------


def test_a_second_mode_leaves_the_first_modes_results_alone(run_copy, monkeypatch):
    out = RunPaths(run_copy).ablation
    zero_files = {path.name: path.read_bytes() for path in out.iterdir() if path.suffix in (".csv", ".png", ".ckpt")}
    zero = read_mode_summary(out, "zero")
    assert {"single_head.csv", "layer.csv", "pruning.csv", "pruned.ckpt"} <= set(zero_files)

    ablate_with(run_copy, "ablation=[single_head,layer]", "ablation.mode=mean", "ablation.prune.export=false")
    for name, content in zero_files.items():
        assert (out / name).read_bytes() == content, name
    assert (out / "single_head.mean.csv").exists() and (out / "layer.mean.png").exists()
    assert read_mode_summary(out, "zero") == zero  # prunable fractions, the export entry, the baseline: all kept
    mean = read_mode_summary(out, "mean")
    assert set(mean["scans"]) == {"single_head", "layer"} and mean["baseline_loss"] == zero["baseline_loss"]

    calls = count_mask_passes(monkeypatch)
    ablate_with(run_copy, "ablation=[single_head,layer]", "ablation.prune.export=false")
    ablate_with(run_copy, "ablation=[single_head,layer]", "ablation.mode=mean", "ablation.prune.export=false")
    assert len(calls) == 2  # the two baselines: every scan of both modes read back


def test_changed_settings_keep_the_earlier_record_under_superseded(run_copy):
    out = RunPaths(run_copy).ablation
    ablate_with(run_copy, "ablation=layer", "ablation.n_eval=8", "ablation.prune.export=false")
    summary = json.loads((out / "summary.json").read_text())
    (old,) = summary["superseded"]
    assert old["mode"] == "zero" and "n_eval: 24 -> 8" in old["reason"]
    assert "pruned" in old and "prunable_fraction" in old
    assert summary["modes"]["zero"]["settings"]["n_eval"] == 8 and set(summary["modes"]["zero"]["scans"]) == {"layer"}


# --- 3. fingerprints survive a move -------------------------------------------------------------------------------


def test_a_moved_run_directory_reads_every_scan_back(trained_run, tmp_path, monkeypatch):
    moved = tmp_path / "elsewhere" / "moved-run"
    shutil.copytree(trained_run, moved)
    # Lightning's checkpoint names its folder: a checkpoint re-saved where the run now lives differs in its bytes.
    ckpt_path = RunPaths(moved).last_ckpt
    checkpoint = torch.load(ckpt_path, weights_only=False)
    for state in checkpoint["callbacks"].values():
        state["dirpath"] = str(ckpt_path.parent)
    torch.save(checkpoint, ckpt_path)
    assert ckpt_path.read_bytes() != RunPaths(trained_run).last_ckpt.read_bytes()

    calls = count_mask_passes(monkeypatch)
    ablate_with(moved, "ablation=[single_head,layer,pruning]", "ablation.prune.export=false")
    assert len(calls) == 1  # the baseline only


# --- 2. data integrity ----------------------------------------------------------------------------------------------


def test_changed_text_data_is_refused_then_allowed_and_recorded(tmp_path, monkeypatch):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog. " * 200)
    text = ["data=text", f"data.path={corpus}", "data.seq_len=32", "data.batch_size=8", "ablation=baseline"]
    run_dir = train_run(tmp_path / "run", text)
    out = RunPaths(run_dir).ablation
    assert json.loads(RunPaths(run_dir).data_fingerprint.read_text())["val"]["examples"] > 0
    before = (out / "baseline.csv").read_bytes()

    corpus.write_text("An entirely different text, which the model never saw. " * 200)
    with pytest.raises(ConfigError) as error:
        ablate_with(run_dir, "ablation=[baseline,single_head]")
    assert error.value.key == "ablation.allow_data_change" and "\n" not in str(error.value)
    assert "split val" in str(error.value) and str(corpus) in str(error.value)
    assert (out / "baseline.csv").read_bytes() == before and not (out / "single_head.csv").exists()

    proc = subprocess.run(
        [sys.executable, "-m", "headcount.cli.ablate", f"run_dir={run_dir}", "ablation=baseline"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert "ablation.allow_data_change=False" in proc.stderr

    ablate_with(run_dir, "ablation=baseline", "ablation.allow_data_change=true")
    data = read_mode_summary(out)["data"]
    assert data["allow_data_change"] is True and "val" in data["changed_since_training"]
    assert (out / "baseline.csv").read_bytes() != before  # recomputed on the data as it is now, as asked


def test_damaged_cache_entry_is_rebuilt_with_a_notice(tmp_path, caplog):
    corpus = tmp_path / "a.txt"
    corpus.write_text("some text to cache, byte by byte. " * 300)
    cfg = DataConfig(source="text", path=str(corpus), seq_len=16, cache_dir=str(tmp_path / "cache"))
    first = build_splits(cfg)["train"][:]["input_ids"].tolist()
    (entry,) = (tmp_path / "cache").glob("text-*")
    arrow = next((entry / "train").glob("*.arrow"))
    arrow.write_bytes(arrow.read_bytes()[: arrow.stat().st_size // 3])  # a copy cut short
    with caplog.at_level(logging.WARNING, logger="headcount.data.cache"):
        again = build_splits(cfg)["train"][:]["input_ids"].tolist()
    assert again == first
    (notice,) = [r.getMessage() for r in caplog.records if "damaged" in r.getMessage()]
    assert "train/" in notice and "rebuilding" in notice and "\n" not in notice
    assert not list((tmp_path / "cache").glob(".*damaged*"))  # the damaged copy is gone


def test_cache_entry_without_checksums_is_kept_and_gets_them(tmp_path):
    corpus = tmp_path / "a.txt"
    corpus.write_text("older caches carry no checksums. " * 300)
    cfg = DataConfig(source="text", path=str(corpus), seq_len=16, cache_dir=str(tmp_path / "cache"))
    first = build_splits(cfg)["val"][:]["input_ids"].tolist()
    (entry,) = (tmp_path / "cache").glob("text-*")
    (entry / "checksums.json").unlink()
    assert build_splits(cfg)["val"][:]["input_ids"].tolist() == first
    assert (entry / "checksums.json").exists()


# --- 4. meaningful importance order -------------------------------------------------------------------------------


def test_one_head_per_layer_keeps_its_raw_importance_and_orders_by_it():
    torch.manual_seed(0)
    cfg = ModelConfig(n_layers=3, d_model=16, n_ctx=8, vocab_size=12, attn=AttentionConfig(n_heads=1), mlp=True)
    model = Transformer(cfg).double()
    g = torch.Generator().manual_seed(0)
    batch = {"input_ids": torch.randint(0, 12, (4, 8), generator=g), "loss_mask": torch.ones(4, 8, dtype=torch.bool)}
    raw_LH = gradient_importance(model, [batch], normalize=False)
    normalized_LH = gradient_importance(model, [batch], normalize=True)
    assert torch.equal(normalized_LH, raw_LH) and len(set(raw_LH.flatten().tolist())) == 3  # not all 1


def test_arbitrary_order_is_warned_about_and_marked(caplog):
    heads_per_layer = [2, 2]
    flat = lambda mask_LH: torch.ones(2, 2) * mask_LH  # noqa: E731 - every head scores the same
    evaluate = lambda masks_MLH: {"loss": 2 + (1 - masks_MLH).sum(dim=(1, 2)), "acc": torch.zeros(len(masks_MLH))}  # noqa: E731
    cfg = PruningConfig(step=0.25, orders=["gradient", "random"], random_seeds=1)
    with caplog.at_level(logging.WARNING, logger="headcount.ablation.methods.pruning"):
        curves = pruning_curves(evaluate, flat, None, heads_per_layer, cfg, 0, {"loss": 2.0, "acc": 0.0})
    assert any("gradient is arbitrary" in r.getMessage() for r in caplog.records)
    assert curves.groupby("order")["arbitrary_order"].all().to_dict() == {"gradient": True, "random": False}


def test_report_keeps_an_arbitrary_orders_fraction_apart(tmp_path):
    summary = {"baseline_loss": 2.0, "prunable_fraction": {"gradient": 0.0, "single_head": 0.5}}
    headline = summary_headline({**summary, "arbitrary_orders": ["gradient"]})
    assert headline == {
        "baseline_loss": 2.0,
        "prunable_fraction_arbitrary/gradient": 0.0,
        "prunable_fraction/single_head": 0.5,
    }
    runs = pd.DataFrame([{"run": "a", "status": "finished", "params": 100, "test/loss": 2.0, **headline}])
    markdown = report_markdown(tmp_path, runs, [], {})
    assert "prunable_fraction_arbitrary/gradient" in markdown and ARBITRARY_NOTE in markdown
    assert "| prunable_fraction/gradient" not in markdown


# --- 5. an export that says what it did ------------------------------------------------------------------------------


def test_export_of_no_heads_is_refused_before_any_work(run_copy):
    out = RunPaths(run_copy).ablation
    shutil.rmtree(out)
    for overrides, key in (
        (["ablation.prune.fraction=0.05"], "ablation.prune.fraction"),  # round(0.05 x 8 heads) = 0
        (["ablation.prune.heads=[]", "ablation.prune.fraction=null"], "ablation.prune.heads"),
    ):
        with pytest.raises(ConfigError) as error:
            ablate_with(run_copy, "ablation=single_head", "ablation.prune.export=true", *overrides)
        assert error.value.key == key and "at least one head" in str(error.value)
    assert not out.exists() or not list(out.glob("*.csv"))


def test_export_with_a_prunable_fraction_of_zero_writes_no_checkpoint(run_copy, monkeypatch):
    out = RunPaths(run_copy).ablation
    shutil.rmtree(out)
    monkeypatch.setattr(export_module, "prunable_fraction", lambda session, order: 0.0)
    with pytest.raises(ConfigError) as error:
        ablate_with(run_copy, "ablation=single_head", "ablation.prune.export=true", "ablation.prune.fraction=null")
    assert error.value.key == "ablation.prune.order" and "prunable fraction 0" in str(error.value)
    assert not list(out.glob("pruned*"))


def test_export_prints_the_heads_removed_and_the_speedup_spread(run_copy, capsys):
    heads = ["ablation.prune.heads=[[0,1],[1,3]]", "ablation.prune.fraction=null"]
    ablate_with(run_copy, "ablation=single_head", "ablation.prune.export=true", *heads)
    err = capsys.readouterr().err
    assert "removed 2 of 8 heads (L0H1, L1H3)" in err and "median of 7 repeats, range" in err
    pruned = read_mode_summary(RunPaths(run_copy).ablation)["pruned"]
    assert pruned["heads_removed_names"] == ["L0H1", "L1H3"] and pruned["speed_repeats"] == 7
    assert pruned["speedup_min"] <= pruned["speedup"] <= pruned["speedup_max"]


# --- 6. figures a reader can trust -------------------------------------------------------------------------------


def test_figures_name_model_data_mode_and_units_and_show_the_tolerance(run_copy, monkeypatch):
    saved: dict[str, matplotlib.figure.Figure] = {}
    real = matplotlib.figure.Figure.savefig
    monkeypatch.setattr(
        matplotlib.figure.Figure,
        "savefig",
        lambda self, path, **kw: saved.__setitem__(Path(path).name, self) or real(self, path, **kw),
    )
    shutil.rmtree(RunPaths(run_copy).ablation)
    ablate_with(run_copy, "ablation=[single_head,pruning]", "ablation.prune.export=false")
    figures = {name.split(".tmp")[0].lstrip("."): fig for name, fig in saved.items()}
    for name in ("single_head", "pruning"):
        title = figures[name].axes[0].get_title().replace("\n", " ")
        assert "model tiny (2 layers x 4 heads, d_model 32)" in title and "data induction" in title
        assert "zero ablation" in title
    single_head = figures["single_head"]
    assert single_head.axes[1].get_ylabel() == "loss increase (nats)"  # the colour bar
    pruning = figures["pruning"].axes[0]
    assert pruning.get_yscale() == "symlog" and "%" in pruning.get_ylabel()
    assert pruning.get_xlabel() == "fraction of heads pruned"
    tolerance = [line for line in pruning.get_lines() if line.get_label().startswith("tolerance")]
    (level,) = {float(y) for y in tolerance[0].get_ydata()}
    low, high = pruning.get_ylim()
    assert level == 1.0 and low < level < high  # 1% drawn inside the axes


# --- 7. records -------------------------------------------------------------------------------------------------------


def test_result_files_record_mode_splits_and_sizes(run_copy):
    out = RunPaths(run_copy).ablation
    zero = pd.read_csv(out / "pruning.csv", keep_default_na=False)
    n_targets = read_mode_summary(out)["n_targets"]
    assert set(RECORD_COLUMNS) <= set(zero.columns)
    assert zero[["mode", "split", "n_eval", "n_targets"]].drop_duplicates().values.tolist() == [
        ["zero", "val", 24, n_targets]
    ]
    assert set(zero["reference_split"]) == {""}  # zero ablation uses no reference

    mean = ["ablation.mode=mean", "ablation.n_reference=40", "ablation.prune.export=false"]
    ablate_with(run_copy, "ablation=[single_head]", *mean)
    mean = pd.read_csv(out / "single_head.mean.csv")
    record = mean[list(RECORD_COLUMNS)].drop_duplicates()
    assert record.values.tolist() == [["mean", "loss", "val", 24, n_targets, "train", 40]]
    assert read_mode_summary(out, "mean")["settings"]["n_reference"] == 40
