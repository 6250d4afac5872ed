"""Ablation end to end: masks and custom files, the run-directory layout, resume, bad input, figures, the CLI."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from datasets import Dataset
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from headcount.ablation.engine import modes
from headcount.ablation.engine.evaluator import MaskEvaluator
from headcount.ablation.engine.masks import (
    all_heads,
    gates_to_masks,
    layer_masks,
    leave_one_in_masks,
    load_custom_masks,
    masks_to_gates,
    most_important_heads,
    pair_masks,
    single_head_masks,
)
from headcount.ablation.engine.modes import resample_sources
from headcount.ablation.records import resumable
from headcount.ablation.records.results import RECORD_COLUMNS
from headcount.ablation.records.summary import read_mode_summary
from headcount.ablation.scans import KINDS, validate_scans
from headcount.ablation.scans.base import typed_scans
from headcount.ablation.scans.mask_scan import SCAN_COLUMNS
from headcount.ablation.scans.pruning import pruning_figure
from headcount.cli.ablate import ablate, typed_ablation_keys
from headcount.cli.errors import BAD_INPUT, as_config_error
from headcount.cli.train import run
from headcount.config import CONF_DIR
from headcount.config.ablation import AblationConfig, PruningConfig
from headcount.data.examples import split_examples
from headcount.errors import ConfigError
from headcount.run_dir import RunPaths, load_model

RECORD = [c for c in RECORD_COLUMNS if c != "mode"]  # mask scans have a mode column of their own
SMOKE = ["model=tiny", "data=induction", "trainer=smoke", "logger=none"]
SMOKE += ["data.n_train=64", "data.n_val=24", "data.n_test=16", "data.seq_len=32"]


def compose_config(name: str, overrides: list[str]):
    GlobalHydra.instance().clear()
    with initialize_config_dir(CONF_DIR, version_base="1.3"):
        return compose(name, overrides=overrides)


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory) -> Path:
    """A smoke-trained run whose training config asked for the single_head scan, with the .hydra/config.yaml that a
    `headcount-train` run leaves."""
    run_dir = tmp_path_factory.mktemp("trained") / "run"
    cfg = compose_config("train", SMOKE + ["ablation=single_head", "ablation.progress=false"])
    run(cfg, run_dir)
    RunPaths(run_dir).config.parent.mkdir()
    OmegaConf.save(cfg, RunPaths(run_dir).config)
    return run_dir


@pytest.fixture
def run_copy(trained_run, tmp_path) -> Path:
    """A fresh copy of the trained run, without its ablation results."""
    copy = tmp_path / "run"
    shutil.copytree(trained_run, copy)
    shutil.rmtree(copy / "ablation")
    return copy


def ablate_with(run_dir: Path, *overrides: str) -> list[Path]:
    overrides = [f"run_dir={run_dir}", "ablation.progress=false", *overrides]
    try:
        cfg = compose_config("ablate", overrides)
    except BAD_INPUT as e:  # a value outside a choice is refused at compose time, as headcount-ablate reports it
        raise as_config_error(e) from e
    return ablate(cfg, typed_ablation_keys(overrides))


# --- masks ------------------------------------------------------------------------------------------------------


def test_built_in_masks_have_readable_unique_names():
    hpl = [3, 2]
    assert [m.name for m in single_head_masks(hpl)] == ["L0H0", "L0H1", "L0H2", "L1H0", "L1H1"]
    assert [(m.name, m.heads_off) for m in layer_masks(hpl)][1] == ("L1", ((1, 0), (1, 1)))
    keep = leave_one_in_masks(hpl)
    assert keep[1].name == "L0 keep H1" and keep[1].heads_off == ((0, 0), (0, 2))
    pairs = pair_masks(all_heads(hpl))
    assert len(pairs) == 10 and pairs[0].name == "L0H0+L0H1"
    gates = masks_to_gates(pairs, hpl)
    assert gates.shape == (10, 2, 3) and int((gates == 0).sum()) == 20
    assert [m.name for m in gates_to_masks(gates, hpl)] == [m.name for m in pairs]


def test_pairs_among_top_k_heads_by_single_head_delta():
    delta_LH = torch.tensor([[0.1, 0.5, 0.0], [0.3, 0.2, 9.0]])  # head L1H2 does not exist
    assert most_important_heads(delta_LH, [3, 2], 2) == [(0, 1), (1, 0)]


def test_custom_masks_parse_in_both_forms(tmp_path):
    path = tmp_path / "masks.yaml"
    path.write_text("- [[0, 1], [1, 0]]\n- {name: prev-token, heads: [[1, 1]]}\n- []\n")
    masks = load_custom_masks(path, [2, 2], "ablation.scans.custom.masks_file")
    assert [(m.name, m.heads_off, m.layer, m.head) for m in masks] == [
        ("L0H1+L1H0", ((0, 1), (1, 0)), -1, -1),
        ("prev-token", ((1, 1),), 1, 1),
        ("none", (), -1, -1),
    ]
    json_path = tmp_path / "masks.json"
    json_path.write_text(json.dumps([[[0, 0]], {"name": "x", "heads": [[1, 1], [0, 1]]}]))
    assert [m.name for m in load_custom_masks(json_path, [2, 2], "k")] == ["L0H0", "x"]


@pytest.mark.parametrize(
    "text, message",
    [
        ("- [[0, 5]]\n", "no such head: layer 0 has heads 0..1"),
        ("- [[3, 0]]\n", "no such layer"),
        ("- [[0, 1]]\n- [0, 1]\n", "entry 1"),
        ("- {heads: [[0, 1]], colour: red}\n", "colour"),
        ("- [[0, 1]\n", "does not parse"),
        ("{}\n", "non-empty list"),
        ("- {name: a, heads: [[0, 0]]}\n- {name: a, heads: [[0, 1]]}\n", "distinct name"),
    ],
)
def test_bad_custom_masks_name_the_key_and_entry(tmp_path, text, message):
    path = tmp_path / "masks.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message) as error:
        load_custom_masks(path, [2, 2], "ablation.scans.mine.masks_file")
    assert error.value.key == "ablation.scans.mine.masks_file"
    assert "\n" not in str(error.value)


def test_resample_pairing_is_seeded_and_never_pairs_an_example_with_itself():
    a, b = resample_sources(10, 10, seed=3, same_split=True), resample_sources(10, 10, seed=3, same_split=True)
    assert torch.equal(a, b) and not (a == torch.arange(10)).any()
    cycled = resample_sources(7, 3, seed=0, same_split=False)
    assert torch.equal(cycled[:3], cycled[3:6]) and set(cycled.tolist()) == {0, 1, 2}


def test_empty_reference_split_is_a_config_error():
    splits = {"train": Dataset.from_dict({"input_ids": [], "loss_mask": []})}
    with pytest.raises(ConfigError, match="has no examples") as error:
        split_examples(splits, "train", 16, "ablation.reference_split")
    assert error.value.key == "ablation.reference_split"


def test_command_line_keys_that_override_the_run_settings():
    overrides = ["run_dir=x", "ablation=[layer,pairs]", "ablation.mode=mean", "+ablation.n_eval=8"]
    overrides += ["ablation.scans.pairs.top_k=3"]
    assert typed_ablation_keys(overrides) == ["ablation.mode", "ablation.n_eval"]


# --- scan kinds -------------------------------------------------------------------------------------------------


def test_every_scan_config_file_is_a_registered_kind():
    kinds = {
        path.stem: yaml.safe_load(path.read_text())["kind"] for path in (Path(CONF_DIR) / "ablation").glob("*.yaml")
    }
    assert all(stem == kind for stem, kind in kinds.items())
    assert set(kinds) == set(KINDS)


@pytest.mark.parametrize(
    "scan, settings, key",
    [
        ({"kind": "triples"}, {}, "ablation.scans.s.kind"),
        ({"kind": "custom"}, {}, "ablation.scans.s.masks_file"),
        ({"kind": "pairs", "top_k": 1}, {}, "ablation.scans.s.top_k"),
        ({"kind": "l0_gates", "l0": {"steps": 0}}, {}, "ablation.scans.s.l0.steps"),
        ({"kind": "l0_gates", "l0": {"stepz": 3}}, {}, "ablation.scans.s.l0.stepz"),
        ({"kind": "pruning"}, {"pruning": PruningConfig(step=0)}, "ablation.pruning.step"),
        ({"kind": "single_head", "receivers": ["L1H2.q"]}, {}, "ablation.scans.s.receivers"),
        ({"kind": "pairs", "top_k": "six"}, {}, "ablation.scans.s.top_k"),
    ],
)
def test_scan_checks_need_no_model(scan, settings, key):
    with pytest.raises(ConfigError) as error:
        validate_scans(AblationConfig(scans=typed_scans({"s": scan}), **settings))
    assert error.value.key == key
    validate_scans(AblationConfig(scans=typed_scans({"s": {"kind": "pairs", "top_k": 2}})))


# --- figures ----------------------------------------------------------------------------------------------------


def scan_frame(kind: str, masks) -> pd.DataFrame:
    values = np.linspace(-0.5, 1.0, len(masks))
    return pd.DataFrame(
        {
            "scan": kind,
            "mask": [m.name for m in masks],
            "layer": [m.layer for m in masks],
            "head": [m.head for m in masks],
            "mode": "zero",
            "delta_loss": values,
        }
    )


@pytest.fixture
def drawn(monkeypatch):
    """The figures saved while a test runs (matplotlib Figures, before they are closed), in order."""
    from matplotlib.figure import Figure

    figures, savefig = [], Figure.savefig

    def keep(fig, *args, **kwargs):
        figures.append(fig)
        return savefig(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    return figures


def shown_values(fig) -> np.ndarray:
    """The finite values a figure shows, in the order drawn: a heatmap's cells row by row, or a bar chart's bars."""
    ax = fig.axes[0]
    if ax.images:
        values = np.asarray(ax.images[0].get_array(), dtype=float).ravel()
        return values[np.isfinite(values)]
    return np.array([bar.get_width() for bar in ax.patches])  # horizontal bars: their length is the value


@pytest.mark.parametrize(
    "kind, masks",
    [
        ("single_head", single_head_masks([4, 3])),
        ("single_head", single_head_masks([20] * 20)),  # too big to write values in
        ("leave_one_in", leave_one_in_masks([4, 4])),
        ("layer", layer_masks([4, 4, 4])),
        ("pairs", pair_masks(all_heads([3, 3]))),
        ("custom", pair_masks(all_heads([2, 2]))),
    ],
)
def test_scan_figures_show_the_tables_numbers(tmp_path, drawn, kind, masks):
    table = scan_frame(kind, masks)
    path = KINDS[kind].figure(table, tmp_path / f"{kind}.png")
    assert path.exists() and len(drawn) == 1
    expected = np.sort(table["delta_loss"].to_numpy())
    if kind == "pairs":  # a symmetric grid: each pair's cell twice
        expected = np.sort(np.repeat(expected, 2))
    np.testing.assert_allclose(np.sort(shown_values(drawn[0])), expected, rtol=1e-12)
    if kind == "custom":  # one bar per mask, in the table's order
        np.testing.assert_allclose(shown_values(drawn[0]), table["delta_loss"], rtol=1e-12)
    if kind == "single_head":  # each head's value in its own cell: row = layer, column = head
        grid = np.asarray(drawn[0].axes[0].images[0].get_array(), dtype=float)
        np.testing.assert_allclose(grid[table["layer"], table["head"]], table["delta_loss"], rtol=1e-12)


def test_pruning_figure_draws_each_orders_curve(tmp_path, drawn):
    rows = [
        (order, seed, f, f * 0.5 + seed * 0.01 + (order == "random"))
        for order, seeds in (("gradient", [0]), ("random", [0, 1, 2]))
        for seed in seeds
        for f in (0.0, 0.5, 1.0)
    ]
    curves = pd.DataFrame(rows, columns=["order", "seed", "fraction", "loss"])
    path = pruning_figure(curves, tmp_path / "pruning.png", baseline_loss=1.0, tolerance=0.05, title="t")
    assert path.exists() and len(drawn) == 1
    lines = {line.get_label(): line for line in drawn[0].axes[0].get_lines()}
    fractions = np.array([0.0, 0.5, 1.0])
    # loss / baseline - 1 in %: gradient's one curve, random's mean over its three seeds (0.01 on average)
    np.testing.assert_allclose(lines["gradient"].get_xdata(), fractions)
    np.testing.assert_allclose(lines["gradient"].get_ydata(), 100 * (fractions * 0.5 - 1.0), atol=1e-9)
    np.testing.assert_allclose(lines["random"].get_ydata(), 100 * (fractions * 0.5 + 0.01), atol=1e-9)


# --- end to end -------------------------------------------------------------------------------------------------


def test_training_runs_the_scans_its_config_lists(trained_run):
    out = RunPaths(trained_run).ablation
    table = pd.read_csv(out / "single_head.csv")
    assert list(table.columns) == SCAN_COLUMNS + RECORD and len(table) == 8
    assert (out / "single_head.png").stat().st_size > 1000
    summary = read_mode_summary(out, "zero")
    assert summary["most_important_head"]["mask"] == table.loc[table["delta_loss"].idxmax(), "mask"]
    assert RunPaths(trained_run).done.exists()


def test_ablate_writes_every_scan_kind_in_the_run_layout(run_copy, tmp_path):
    masks_file = tmp_path / "masks.yaml"
    masks_file.write_text("- {name: both-L0H0-L1H1, heads: [[0, 0], [1, 1]]}\n- [[1, 2]]\n")
    written = ablate_with(
        run_copy,
        "ablation=[baseline,layer,leave_one_in,pairs,custom,importance,pruning]",
        "ablation.mode=mean",
        "ablation.scans.pairs.top_k=3",
        f"ablation.scans.custom.masks_file={masks_file}",
        "ablation.pruning.step=0.25",
        "ablation.prune.export=true",
    )
    out = RunPaths(run_copy).ablation
    for scan, rows in (("baseline", 1), ("layer", 2), ("leave_one_in", 8), ("pairs", 3), ("custom", 2)):
        table = pd.read_csv(out / f"{scan}.mean.csv")
        assert list(table.columns) == SCAN_COLUMNS + RECORD and len(table) == rows, scan
        assert (table["mode"] == "mean").all()
        assert not (out / f"{scan}.mean.partial.csv").exists()
        assert scan == "baseline" or (out / f"{scan}.mean.png").stat().st_size > 1000
    assert pd.read_csv(out / "custom.mean.csv")["mask"].tolist() == ["both-L0H0-L1H1", "L1H2"]
    importance = pd.read_csv(out / "importance.mean.csv")
    scores = [
        "grad_importance",
        "grad_importance_raw",
        "grad_importance_per_example",
        "grad_importance_per_example_raw",
    ]
    scores += ["grad_importance_per_example_raw_ci_low", "grad_importance_per_example_raw_ci_high", "top_share"]
    scores.append("single_head_delta")  # pairs ran single_head
    assert list(importance.columns) == ["layer", "head", *scores, "mode", *RECORD]
    curves = pd.read_csv(out / "pruning.mean.csv")
    assert set(curves["order"]) == {"gradient", "gradient_iterative", "single_head", "random"}
    assert (out / "pruning.mean.png").stat().st_size > 1000 and (out / "replacements_mean.pt").exists()
    assert all(path.name.endswith(".mean.csv") for path in out.glob("*.csv"))  # no zero-mode names

    summary = read_mode_summary(out, "mean")
    assert summary["settings"]["mode"] == "mean" and summary["baseline_loss"] > 0
    assert set(summary["prunable_fraction"]) == set(curves["order"])
    assert {"single_head", "pairs", "pruning", "importance"} <= set(summary["scans"])
    pruned = summary["pruned"]
    assert abs(pruned["loss_pruned"] - pruned["loss_masked"]) < 1e-5
    assert pruned["tokens_per_s_full"] > 0 and pruned["tokens_per_s_pruned"] > 0
    model = load_model(out / "pruned.mean.ckpt")
    assert sum(model.heads_per_layer) == 8 - pruned["n_heads_removed"]
    expected = {out / "summary.json", out / "pruned.mean.ckpt", out / "pairs.mean.csv", out / "pruning.mean.png"}
    assert set(written) >= expected


def test_rerun_reads_up_to_date_results_back(run_copy, monkeypatch):
    ablate_with(run_copy, "ablation=[layer,pairs]")
    before = pd.read_csv(RunPaths(run_copy).ablation / "pairs.csv")
    calls = []
    real = MaskEvaluator.accumulate
    monkeypatch.setattr(MaskEvaluator, "accumulate", lambda self, *a, **k: calls.append(1) or real(self, *a, **k))
    ablate_with(run_copy, "ablation=[layer,pairs]")
    assert len(calls) == 1  # the baseline only
    pd.testing.assert_frame_equal(pd.read_csv(RunPaths(run_copy).ablation / "pairs.csv"), before)


def test_ablate_inherits_the_run_settings_under_typed_keys(run_copy, monkeypatch):
    config = OmegaConf.load(RunPaths(run_copy).config)
    config.ablation.n_eval = 8
    OmegaConf.save(config, RunPaths(run_copy).config)
    summary = RunPaths(run_copy).ablation / "summary.json"
    ablate_with(run_copy, "ablation=layer")
    assert read_mode_summary(summary.parent)["settings"]["n_eval"] == 8
    ablate_with(run_copy, "ablation=layer", "ablation.n_eval=12")
    assert read_mode_summary(summary.parent)["settings"]["n_eval"] == 12


def test_cli_finds_the_training_scans_up_to_date(trained_run, monkeypatch):
    calls = []
    real = MaskEvaluator.accumulate
    monkeypatch.setattr(MaskEvaluator, "accumulate", lambda self, *a, **k: calls.append(1) or real(self, *a, **k))
    ablate_with(trained_run, "ablation=single_head")
    assert len(calls) == 1  # the baseline only


def test_interrupted_ablation_resumes_to_the_same_csv(run_copy, monkeypatch):
    out = RunPaths(run_copy).ablation
    ablate_with(run_copy, "ablation=single_head", "ablation.masks_per_pass=2")
    uninterrupted = (out / "single_head.csv").read_text()
    shutil.rmtree(out)

    monkeypatch.setattr(resumable, "SAVE_INTERVAL_S", 0.0)
    real_pass, passes = MaskEvaluator.masked_pass, []

    def interrupted_pass(self, clean, gates_PLH, start, position_P):
        if start < self.model.n_layers:  # not the baseline, which the clean pass gives
            if len(passes) == 2:
                raise KeyboardInterrupt
            passes.append(len(gates_PLH))
        return real_pass(self, clean, gates_PLH, start, position_P)

    monkeypatch.setattr(MaskEvaluator, "masked_pass", interrupted_pass)
    with pytest.raises(KeyboardInterrupt):
        ablate_with(run_copy, "ablation=single_head", "ablation.masks_per_pass=2")
    assert (out / "single_head.partial.csv").exists() and not (out / "single_head.csv").exists()

    resumed = []

    def counted_pass(self, clean, gates_PLH, start, position_P):
        resumed.extend([len(gates_PLH)] if start < self.model.n_layers else [])
        return real_pass(self, clean, gates_PLH, start, position_P)

    monkeypatch.setattr(MaskEvaluator, "masked_pass", counted_pass)
    ablate_with(run_copy, "ablation=single_head", "ablation.masks_per_pass=2")
    assert resumed == [2, 2]  # one batch of 24: 8 heads in 4 passes of 2, 2 of them saved before the interruption
    assert not (out / "single_head.partial.csv").exists()
    assert (out / "single_head.csv").read_text() == uninterrupted


def test_resample_sources_are_saved_and_reused(run_copy, monkeypatch):
    ablate_with(run_copy, "ablation=layer", "ablation.mode=resample", "ablation.reference_split=val")
    out = RunPaths(run_copy).ablation
    assert (out / "replacements_resample.pt").exists()

    def not_again(*args):
        raise AssertionError("the saved pairing should have been reused")

    monkeypatch.setattr(modes, "resample_sources", not_again)
    ablate_with(run_copy, "ablation=single_head", "ablation.mode=resample", "ablation.reference_split=val")
    table = pd.read_csv(out / "single_head.resample.csv")
    assert (table["mode"] == "resample").all() and table["delta_loss"].abs().max() > 0


def test_cli_writes_inside_the_run_and_prints_the_paths(run_copy, tmp_path):
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).parents[1] / "scripts" / "ablate.py"), f"run_dir={run_copy}"]
        + ["ablation=[baseline,layer]", "ablation.progress=false"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = RunPaths(run_copy).ablation
    assert str(out / "layer.csv") in proc.stderr and (out / "layer.png").exists()
    assert list((out / "logs").iterdir())  # Hydra's files stay inside the run
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_cli_bad_input_is_one_line_and_exit_2(run_copy, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "headcount.cli.ablate", f"run_dir={run_copy}", "ablation.mode=median"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert proc.returncode == 2
    assert "ablation.mode='median'" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["ablation.mode=median"], "ablation.mode"),
        (["ablation.scans.single_head.kind=triples"], "ablation.scans.single_head.kind"),
        (["ablation.mode=mean", "ablation.n_reference=0"], "ablation.n_reference"),
        (["ablation.mode=resample", "ablation.reference_split=dev"], "ablation.reference_split"),
        (["ablation=custom"], "ablation.scans.custom.masks_file"),
        (["ablation=custom", "ablation.scans.custom.masks_file=BAD_MASKS"], "ablation.scans.custom.masks_file"),
        (["ablation=custom", "ablation.scans.custom.masks_file=NO_SUCH_FILE"], "ablation.scans.custom.masks_file"),
        (["ablation.prune.export=true", "ablation.prune.heads=[[0,9]]"], "ablation.prune.heads"),
        (["ablation.prune.export=true", "ablation.mode=resample"], "ablation.prune.export"),
        (["ablation.prune.export=true", "ablation.prune.order=l0"], "ablation.prune.order"),
        (["ablation.prune.export=true", "ablation.prune.order=l0_gates"], "ablation.prune.order"),
        (
            ["ablation.prune.export=true", "ablation.prune.order=l0_gates", "ablation.prune.fraction=0.5"],
            "ablation.prune.fraction",
        ),
        (
            ["ablation=l0_gates", "ablation.scans.l0_gates.l0.target_heads=[2,6]"]
            + ["ablation.prune.export=true", "ablation.prune.order=l0_gates"],
            "ablation.prune.l0_target_heads",
        ),
        (["ablation.device=tpu"], "ablation.device"),
    ],
)
def test_bad_input_names_the_key_and_writes_no_results(run_copy, tmp_path, overrides, key):
    bad_masks = tmp_path / "bad.yaml"
    bad_masks.write_text("- [[0, 0]]\n- [[7, 0]]\n")
    overrides = [
        o.replace("BAD_MASKS", str(bad_masks)).replace("NO_SUCH_FILE", str(tmp_path / "x.yaml")) for o in overrides
    ]
    with pytest.raises(ConfigError) as error:
        ablate_with(run_copy, *overrides)
    assert error.value.key == key and "\n" not in str(error.value)
    assert not list(RunPaths(run_copy).ablation.glob("*.csv"))


def test_run_dir_without_a_finished_checkpoint_is_refused(run_copy):
    (RunPaths(run_copy).metrics).unlink()
    with pytest.raises(ConfigError, match="no finished training run") as error:
        ablate_with(run_copy)
    assert error.value.key == "run_dir"
    assert not list(RunPaths(run_copy).ablation.glob("*.csv"))


# --- learned gates and pattern scores ---------------------------------------------------------------------------


def test_l0_gates_and_head_scores_scans_write_their_results(run_copy):
    ablate_with(
        run_copy,
        "ablation=[l0_gates,head_scores]",
        "ablation.scans.l0_gates.l0.steps=200",
        "ablation.scans.l0_gates.l0.target_heads=[2,6]",
        "ablation.n_reference=64",
    )
    out = RunPaths(run_copy).ablation
    gates = pd.read_csv(out / "l0_gates.csv")
    assert set(gates["target_heads"]) == {2, 6}
    kept = gates.groupby("target_heads")["kept"].sum()
    assert (kept == gates.groupby("target_heads")["n_kept"].first()).all()
    assert kept[2] < kept[6] <= 8
    summary = read_mode_summary(out)
    assert [run["target_heads"] for run in summary["l0_gates"]] == [2, 6]
    scores = pd.read_csv(out / "head_scores.csv")
    assert (
        (
            (scores[["prev_token_score", "induction_score"]] >= 0)
            & (scores[["prev_token_score", "induction_score"]] <= 1)
        )
        .all()
        .all()
    )
    for score in ("prev_token_score", "induction_score"):  # each score's bootstrap interval over the sequences
        low, high = scores[f"{score}_ci_low"], scores[f"{score}_ci_high"]
        assert (low <= scores[score] + 1e-12).all() and (scores[score] <= high + 1e-12).all() and (low < high).any()
        assert scores[f"{score}_top_share"].between(0, 1).all()
    shared = json.loads((out / "summary.json").read_text())["mode_independent"]["intervals"]["head_scores"]
    assert set(shared) == {"prev_token_score", "induction_score"} and shared["induction_score"]["resamples"] == 1000
    names = ("l0_gates.png", "head_scores_prev_token_score.png", "head_scores_induction_score.png")
    for name in (*names, "head_scores_intervals.png"):
        assert (out / name).stat().st_size > 0


def test_l0_gates_mask_exports_as_a_smaller_model(run_copy):
    """order=l0_gates: the pruned checkpoint keeps exactly the heads the chosen target's gates kept, and its loss is
    the loss the scan measured for that mask."""
    l0 = ["ablation.scans.l0_gates.l0.steps=200", "ablation.scans.l0_gates.l0.target_heads=[2,6]"]
    export = ["ablation.prune.export=true", "ablation.prune.order=l0_gates", "ablation.prune.l0_target_heads=2"]
    ablate_with(run_copy, "ablation=l0_gates", "ablation.n_reference=64", *l0, *export)
    out = RunPaths(run_copy).ablation
    gates = pd.read_csv(out / "l0_gates.csv").query("target_heads == 2")
    pruned = read_mode_summary(out)["pruned"]
    assert pruned["chosen_by"] == "l0_gates" and pruned["target_heads"] == 2
    assert sorted(map(tuple, pruned["heads_removed"])) == sorted(
        (r.layer, r.head) for r in gates.itertuples() if not r.kept
    )
    assert sum(load_model(out / "pruned.ckpt").heads_per_layer) == gates["kept"].sum()
    assert pruned["loss_pruned"] == pytest.approx(gates["loss"].iloc[0], abs=1e-5)


def test_run_dir_with_override_characters_is_quoted_for_hydra():
    from headcount.cli.ablate import quote_run_dir

    args = quote_run_dir(["run_dir=out/a=[x,y],seed=0", "ablation=pruning", "run_dir='kept'"])
    assert args == ["run_dir='out/a=[x,y],seed=0'", "ablation=pruning", "run_dir='kept'"]
