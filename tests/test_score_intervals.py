"""Bootstrap intervals of the ratios the head scans derive (ablation/scans/intervals.py): a mask's gap_fraction (its
delta over the clean-to-corrupted gap, both resampled with the same prompts) and head_circuit's faithfulness (the
circuit against no head kept, over clean against no head kept). One resample is the scan on the prompts it draws,
the intervals cover the full-data value and narrow with more prompts."""

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
import torch
from sweep_helpers import smoke_run

import headcount
from headcount.ablation.engine.evaluation import CounterpartSums
from headcount.ablation.engine.metrics import METRICS
from headcount.ablation.engine.modes import Replacements, Zero
from headcount.ablation.methods.attribution import attribute
from headcount.ablation.methods.direct_effect import direct_effect_sums, direct_effects
from headcount.ablation.scans import intervals
from headcount.ablation.scans.head_circuit import NONE_KEPT, with_faithfulness
from headcount.ablation.scans.intervals import ExampleSums, gap_fraction_interval, score_intervals
from headcount.circuits.bootstrap import RESAMPLES, resample_counts
from headcount.config.ablation import ScanDtype
from headcount.config.task import TaskConfig
from headcount.data.examples import to_batches
from headcount.model import AttentionConfig, ModelConfig, Transformer
from headcount.tasks import IdsOnly, TaskPrompt, encode_task

PROMPTS = [
    {"prompt": [0, 5, 9, 4, 5], "answer": 9, "wrong": 4, "corrupted": [0, 5, 7, 4, 5]},
    {"prompt": [0, 3, 8, 2, 6, 3], "answer": 8, "wrong": 2, "corrupted": [0, 3, 1, 2, 6, 3]},
    {"prompt": [0, 11, 12, 13, 11], "answer": 12, "wrong": 13, "corrupted": [0, 11, 14, 13, 11]},
]
DRAWN = [2, 0, 1]  # one resample: prompt 0 twice, prompt 1 never, prompt 2 once


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return smoke_run(pytest.MonkeyPatch, tmp_path_factory.mktemp("score_intervals"))


def task_of(folder: Path, rows: list[dict], name: str) -> dict:
    (folder / f"{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return {"source": "file", "path": str(folder / f"{name}.jsonl")}


def test_one_resample_is_the_scan_on_the_prompts_it_draws(run_dir, tmp_path, monkeypatch):
    """With the resamples replaced by one draw, each interval's ends are that draw's value; the scans on the drawn
    prompts (prompt 0 twice, prompt 2) give it. In float64 (the scan's float32 cast made float64 here), so that what
    differs, the batches' padding, leaves no rounding."""
    monkeypatch.setattr(ScanDtype, "torch", property(lambda self: torch.float64))
    run = headcount.load_run(shutil.copytree(run_dir, tmp_path / "run"), device="cpu")
    drawn = [row for row, k in zip(PROMPTS, DRAWN) for _ in range(k)]
    full, resample = task_of(tmp_path, PROMPTS, "full"), task_of(tmp_path, drawn, "drawn")
    single = dict(mode="patch", metric="logit_diff")
    circuit = dict(heads=["L0H0", "L1H1"], random_sets=1, metric="logit_diff")
    expected_gap = run.scan("single_head", task=resample, **single)
    expected_circuit = run.scan("head_circuit", task=resample, **circuit)
    monkeypatch.setattr(intervals, "resample_counts", lambda *_: torch.tensor([DRAWN], dtype=torch.float64))
    gap = run.scan("single_head", task=full, **single)
    faithful = run.scan("head_circuit", task=full, **circuit)
    assert expected_gap["gap_fraction"].abs().max() > 1e-3  # not trivially zero, and not the full data's:
    assert not gap["gap_fraction"].equals(expected_gap["gap_fraction"])
    for table, expected, column in ((gap, expected_gap, "gap_fraction"), (faithful, expected_circuit, "faithfulness")):
        for end in ("ci_low", "ci_high"):
            assert table[f"{column}_{end}"].tolist() == pytest.approx(expected[column].tolist(), rel=1e-9, abs=1e-12)
    assert faithful["faithfulness_ci_low"].notna().all()


def planted_sums(n_prompts: int, seed: int = 0) -> tuple[ExampleSums, CounterpartSums, pd.DataFrame]:
    """Per-prompt sums of 5 masks with one point each: clean ~ 3 + noise, counterpart ~ 0 + noise, mask k removes
    k/4 of the gap (noise per prompt), the last mask every head (no head kept)."""
    g = torch.Generator().manual_seed(seed)
    noise = lambda *shape: 0.5 * torch.randn(*shape, generator=g, dtype=torch.float64)  # noqa: E731
    clean_E = 3.0 + noise(n_prompts)
    counterpart_E = noise(n_prompts)
    share_M = torch.arange(5, dtype=torch.float64) / 4
    masks_ME = clean_E[None] + share_M[:, None] * (counterpart_E - clean_E)[None] + noise(5, n_prompts)
    points = torch.ones(n_prompts, dtype=torch.float64)
    sums = ExampleSums(masks_ME, clean_E, points, resample_counts(n_prompts, RESAMPLES, seed))
    value = masks_ME.mean(1)
    table = pd.DataFrame({"mask": ["a", "b", "c", "d", NONE_KEPT], "logit_diff": value.numpy()})
    table["gap_fraction"] = ((value - clean_E.mean()) / (counterpart_E.mean() - clean_E.mean())).numpy()
    return sums, CounterpartSums({}, counterpart_E, points), table


@pytest.mark.parametrize("n_prompts", [16, 256])
def test_intervals_cover_the_full_data_ratio_and_narrow_with_more_prompts(n_prompts):
    sums, counterpart, table = planted_sums(n_prompts)
    low, high = gap_fraction_interval(sums, counterpart)
    assert (low <= table["gap_fraction"]).all() and (table["gap_fraction"] <= high).all()
    faithful = with_faithfulness(table.copy(), float(sums.baseline_E.mean()), "logit_diff", sums)
    assert (faithful["faithfulness_ci_low"] <= faithful["faithfulness"] + 1e-12).all()
    assert (faithful["faithfulness"] <= faithful["faithfulness_ci_high"] + 1e-12).all()
    few, many = planted_sums(16), planted_sums(256)
    width = lambda s: gap_fraction_interval(*s[:2])[1] - gap_fraction_interval(*s[:2])[0]  # noqa: E731
    assert (width(many) < width(few) / 2).all()  # 16 times the prompts: about a quarter of the width


def test_a_single_resample_of_every_prompt_once_is_the_full_data_value():
    """Counts of one each reproduce the table's own ratios: the resampled numerator and gap line up prompt by
    prompt (a counterpart drawn with another prompt's count, an off-by-one, breaks it)."""
    sums, counterpart, table = planted_sums(16)
    once = replace(sums, counts_RE=torch.ones(1, 16, dtype=torch.float64))
    low, high = gap_fraction_interval(once, counterpart)
    assert low.tolist() == pytest.approx(table["gap_fraction"].tolist(), rel=1e-12) and (low == high).all()
    drawn = replace(sums, counts_RE=sums.counts_RE[:1])
    keep = drawn.counts_RE[0]
    numerator = (drawn.masks_ME * keep).sum(1) / keep.sum() - (drawn.baseline_E * keep).sum() / keep.sum()
    gap = ((counterpart.examples_E - drawn.baseline_E) * keep).sum() / keep.sum()
    assert gap_fraction_interval(drawn, counterpart)[0].tolist() == pytest.approx((numerator / gap).tolist(), 1e-12)


def head_task(n_prompts: int):
    """A 2-layer float64 model with random weights and a task of n_prompts prompts of 3 to 5 tokens."""
    torch.manual_seed(0)
    cfg = ModelConfig(n_layers=2, d_model=16, n_ctx=12, vocab_size=20, attn=AttentionConfig(n_heads=4), mlp=False)
    model = Transformer(cfg).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
    prompts = [TaskPrompt([1, 2, 3, 4, 5][: 3 + i % 3], [i % 20], [(i + 7) % 20]) for i in range(n_prompts)]
    return model, prompts


def batches_of(prompts, size: int = 4):
    task = encode_task(prompts, "t", IdsOnly(20, "x"), TaskConfig(source="file", path="t.jsonl"), 12, "task.path")
    return to_batches(task.examples(), size, torch.device("cpu"))


def test_per_prompt_direct_effects_and_attributions_are_the_scores_on_the_prompts_a_resample_draws():
    """Each prompt's sums over its points, in the prompts' order: all of them give the scan's score, and one
    resample's weighted sums give the score computed on the prompts it draws (a prompt drawn twice, one never)."""
    model, prompts = head_task(7)
    counts = resample_counts(7, 1, seed=3)[0]
    drawn = [p for p, k in zip(prompts, counts.long().tolist()) for _ in range(k)]
    assert counts.max() > 1 and counts.min() == 0  # a draw with repeats and a prompt left out
    logit_diff = METRICS["logit_diff"]()
    sums_ELH, points_E = direct_effect_sums(model, batches_of(prompts), logit_diff)
    torch.testing.assert_close(sums_ELH.sum(0) / points_E.sum(), direct_effects(model, batches_of(prompts), logit_diff))
    resampled = torch.einsum("e,elh->lh", counts, sums_ELH) / (counts @ points_E)
    torch.testing.assert_close(
        resampled, direct_effects(model, batches_of(drawn, 3), logit_diff), rtol=1e-12, atol=1e-12
    )
    zero = Replacements(Zero())
    full = attribute(model, batches_of(prompts), zero, logit_diff)
    torch.testing.assert_close(full.example_ELH.sum(0) / full.points_E.sum(), full.estimate_LH, rtol=1e-12, atol=1e-12)
    resampled = torch.einsum("e,elh->lh", counts, full.example_ELH) / (counts @ full.points_E)
    drawn_attribution = attribute(model, batches_of(drawn, 3), zero, logit_diff)
    torch.testing.assert_close(resampled, drawn_attribution.estimate_LH, rtol=1e-12, atol=1e-12)
    # importance's per-prompt form: the mean of |A_p| / n_p over the drawn prompts (each of the 7 is scored)
    per_prompt = full.example_ELH.abs() / full.points_E[:, None, None]
    resampled = torch.einsum("e,elh->lh", counts, per_prompt) / counts.sum()
    torch.testing.assert_close(resampled, drawn_attribution.example_abs_LH, rtol=1e-12, atol=1e-12)


def test_score_intervals_cover_the_score_narrow_with_more_prompts_and_rank_a_planted_top():
    """intervals.score_intervals on planted per-prompt scores of 20 heads (head k's mean k, unit noise)."""

    def planted(n_prompts: int):
        g = torch.Generator().manual_seed(0)
        scores = torch.arange(20, dtype=torch.float64) + torch.randn(n_prompts, 20, generator=g)
        columns, entry = score_intervals(scores, torch.ones(n_prompts, dtype=torch.float64), "direct_effect", 0)
        return scores.mean(0).numpy(), columns, entry

    for n in (16, 256):
        value, columns, entry = planted(n)
        assert (columns["direct_effect_ci_low"] <= value).all() and (value <= columns["direct_effect_ci_high"]).all()
    width = lambda c: c["direct_effect_ci_high"] - c["direct_effect_ci_low"]  # noqa: E731
    assert (width(planted(256)[1]) < width(planted(16)[1]) / 2).all()
    assert entry["top_n"] == 1 and entry["by"] == "|direct_effect|" and columns["top_share"][-1] == 1.0


def test_bench_score_intervals_runs():
    """scripts/bench_score_intervals.py (docs/BENCHMARKS.md's figures) still runs against the code it measures."""
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[1] / "scripts" / "bench_score_intervals.py"
    args = [sys.executable, str(script), "--repeats", "1", "--edges", "500"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "1024 prompts: gap_fraction" in done.stdout and "500 edges, 128 prompts: 3 scores' intervals" in done.stdout
