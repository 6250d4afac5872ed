"""Bootstrap intervals of the head scans (ablation/scans/intervals.py) from each example's sums the evaluator keeps at
no extra pass: the sums are one forward per mask and example by definition (float32 and float64, every mode, several
passes and batches), they survive a partial file, the intervals cover the full-data delta and narrow with more
examples, the same seed gives the same interval, and the top heads' stability is measured against planted rankings."""

import pandas as pd
import pytest
import torch
from test_evaluator import HEADS_PER_LAYER, MODES, make_batches, make_model, make_replacements, reference_replacements

from headcount.ablation.engine.evaluator import MaskEvaluator, MaskTotals
from headcount.ablation.engine.masks import HeadMask, masks_to_gates, single_head_masks
from headcount.ablation.engine.metrics import metric_named
from headcount.ablation.records.distributed import evaluate_resumably
from headcount.ablation.records.resumable import load_partial, partial_key, save_partial
from headcount.ablation.scans.intervals import example_points, top_n, with_intervals
from headcount.circuits.bootstrap import top_n_overlap
from headcount.errors import ConfigError
from headcount.metrics import token_nll_and_correct
from headcount.model.intervention import gated

MASKS = [*single_head_masks(HEADS_PER_LAYER), HeadMask("two", ((0, 1), (2, 3))), HeadMask("none", ())]


@torch.no_grad()
def by_definition(model, batches, gates_MLH, mode) -> torch.Tensor:
    """(M, E): each example's loss summed over its targets, one forward pass of that example alone per mask."""
    rows = []
    for gates_LH in gates_MLH:
        row = []
        for batch in batches:
            for e in range(len(batch["input_ids"])):
                one = {key: value[e : e + 1] for key, value in batch.items()}
                replacements = reference_replacements(mode, model, one)
                logits = model(one["input_ids"], gated(gates_LH, replacements))
                nll_BS, _ = token_nll_and_correct(logits, one["input_ids"])
                row.append(float(nll_BS[one["loss_mask"][:, 1:]].double().sum()))
        rows.append(row)
    return torch.tensor(rows, dtype=torch.float64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("mode", MODES)
def test_each_examples_sums_are_one_forward_per_mask_and_example(mode, dtype):
    model, batches = make_model(dtype), make_batches(n_batches=3, B=3)
    gates = masks_to_gates(MASKS, HEADS_PER_LAYER)
    # 2 masks per pass over 3 batches of 3: an example's sums come from its own batch's passes
    evaluator = MaskEvaluator(model, batches, make_replacements(mode, model), masks_per_pass=2)
    totals = MaskTotals.empty(len(MASKS), evaluator.columns, evaluator.n_examples)
    evaluator.accumulate(gates, totals)
    tol = 1e-10 if dtype == torch.float64 else 2e-4
    torch.testing.assert_close(totals.examples, by_definition(model, batches, gates, mode), rtol=tol, atol=tol)
    # they add up to the sums the table divides, and the examples' points to the points
    torch.testing.assert_close(totals.examples.sum(1), totals.sums[:, 0], rtol=1e-12, atol=1e-9)
    assert int(example_points(evaluator).sum()) == int(totals.n_targets[0])


def test_each_examples_sums_survive_a_partial_file(tmp_path):
    model, batches = make_model(), make_batches()
    evaluator = MaskEvaluator(model, batches, make_replacements("zero", model))
    gates = masks_to_gates(MASKS, HEADS_PER_LAYER)
    totals = MaskTotals.empty(len(MASKS), evaluator.columns, evaluator.n_examples)
    evaluator.accumulate_batch(0, evaluator.mask_set(gates), totals)  # one batch of two done, then a save
    key = partial_key(evaluator, MASKS, "key")  # the fingerprint evaluate_resumably looks for
    save_partial(tmp_path / "p.csv", key, MASKS, totals)
    loaded = load_partial(tmp_path / "p.csv", key, MASKS, evaluator.columns)
    assert torch.equal(loaded.examples, totals.examples) and torch.equal(loaded.sums, totals.sums)
    # resumed from that file (the first batch not evaluated again): every example's sums, as uninterrupted
    real_pass, calls = evaluator.masked_pass, []
    evaluator.masked_pass = lambda clean, *args: calls.append(clean) or real_pass(clean, *args)
    resumed = evaluate_resumably(evaluator, MASKS, tmp_path / "p.csv", "key", "test", False)
    evaluator.masked_pass = real_pass
    assert len({id(clean) for clean in calls}) == 1  # one batch's clean pass: the other was read back
    whole = evaluate_resumably(evaluator, MASKS, tmp_path / "q.csv", "key", "test", False)
    assert resumed.examples is not None and torch.equal(resumed.examples, whole.examples)


def intervals_of(n_batches: int, seed: int = 0) -> tuple[pd.DataFrame, dict]:
    model, batches = make_model(torch.float32), make_batches(n_batches=n_batches, B=8, T=10, seed=1)
    evaluator = MaskEvaluator(model, batches, make_replacements("zero", model))
    masks = single_head_masks(HEADS_PER_LAYER)
    every = MaskTotals.empty(len(masks) + 1, evaluator.columns, evaluator.n_examples)
    evaluator.accumulate(masks_to_gates([*masks, HeadMask("none", ())], HEADS_PER_LAYER), every)
    totals = MaskTotals(every.batches_done[:-1], every.sums[:-1], every.n_targets[:-1], every.columns)
    totals.examples = every.examples[:-1]
    loss = totals.value("loss") - every.value("loss")[-1]
    table = pd.DataFrame({"mask": [m.name for m in masks], "delta_loss": loss.numpy()})
    return with_intervals(table, totals, every.examples[-1], example_points(evaluator), metric_named("loss"), seed)


def test_intervals_cover_the_full_data_delta_shrink_with_more_examples_and_repeat_with_the_seed():
    few, entry = intervals_of(n_batches=2)  # 16 sequences
    many, _ = intervals_of(n_batches=32)  # 256
    for table in (few, many):
        assert (table["delta_loss_ci_low"] <= table["delta_loss"]).all()
        assert (table["delta_loss"] <= table["delta_loss_ci_high"]).all()
    width = lambda t: t["delta_loss_ci_high"] - t["delta_loss_ci_low"]  # noqa: E731
    assert (width(many) < width(few) / 2).all()  # 16 times the examples: about a quarter of the width
    again, _ = intervals_of(n_batches=2)
    pd.testing.assert_frame_equal(again, few, check_exact=True)
    other, _ = intervals_of(n_batches=2, seed=1)
    assert not other["delta_loss_ci_low"].equals(few["delta_loss_ci_low"])
    assert entry["top_n"] == top_n(len(few)) == 1 and 0 <= entry["min_overlap"] <= entry["mean_overlap"] <= 1
    assert few["top_share"].between(0, 1).all() and few["top_share"].sum() == pytest.approx(entry["top_n"])


def planted(n_examples: int, separation: float, seed: int = 0) -> tuple[MaskTotals, torch.Tensor, torch.Tensor]:
    """Per-example loss sums of 20 masks with a planted ranking: mask k's mean damage is separation * k / 19 (mask 19
    does most damage), plus unit noise per example; one point per example, a baseline of zeros."""
    g = torch.Generator().manual_seed(seed)
    damage = separation * torch.arange(20, dtype=torch.float64) / 19
    examples_EM = damage + torch.randn(n_examples, 20, generator=g, dtype=torch.float64)
    totals = MaskTotals.empty(20, ("loss", "acc"), n_examples)
    totals.examples = examples_EM.T.contiguous()
    return totals, torch.zeros(n_examples, dtype=torch.float64), torch.ones(n_examples, dtype=torch.float64)


def test_the_top_heads_stability_follows_planted_rankings():
    table = pd.DataFrame({"mask": [f"m{k}" for k in range(20)], "delta_loss": 0.0})
    loss = metric_named("loss")
    clear = with_intervals(table, *planted(400, separation=40.0), loss, 0)  # the top one stands out: always first
    assert clear[1]["top_n"] == 1 and clear[1]["mean_overlap"] == 1.0 and clear[1]["min_overlap"] == 1.0
    assert clear[0]["top_share"].tolist() == [0.0] * 19 + [1.0]  # the planted top mask, by damage
    noisy = with_intervals(table, *planted(400, separation=0.5), loss, 0)  # neighbours within the noise
    assert noisy[1]["mean_overlap"] < 0.9 and noisy[1]["min_overlap"] == 0.0
    # a metric whose damage is its decrease ranks the same data the other way round: mask 0 on top
    flipped = with_intervals(table, *planted(400, separation=40.0), metric_named("logit_diff"), 0)
    assert flipped[0]["top_share"].tolist() == [1.0] + [0.0] * 19


def test_overlap_of_two_top_n_lists():
    assert top_n_overlap(["L0H1", "L1H2", "L2H0"], ["L2H0", "L0H1", "L1H3"]) == pytest.approx(2 / 3)
    assert top_n_overlap(["a"], ["a"]) == 1.0 and top_n_overlap(["a", "b"], ["c", "d"]) == 0.0
    with pytest.raises(ConfigError, match="top_n"):
        top_n_overlap(["a"], ["a", "b"])


class PlantedRun:
    """A stand-in for a Run whose single_head scan on each seed gives planted deltas (loss: damage is the delta):
    heads a, b, c, d by damage, the third and fourth swapped on seed 2."""

    def __init__(self, source: str = "ioi"):
        self.source, self.scanned = source, []
        self.scan_settings = {}  # the run config lists no scan: each is its kind at its defaults

    def task_settings(self, task):
        from headcount.config.task import TaskConfig

        return TaskConfig(source=self.source, n_prompts=8)

    def scan(self, kind, task=None, **settings):
        self.scanned.append((kind, task.seed, task.name))
        delta = {"a": 4.0, "b": 3.0, "c": 2.0, "d": 1.0} | ({"c": 0.5} if task.seed == 2 else {})
        return pd.DataFrame({"mask": list(delta), "delta_loss": list(delta.values()), "metric": "loss"})


def test_seed_stability_overlaps_planted_tops():
    from headcount.api import Run
    from headcount.api_stability import top_heads

    seed_stability = Run.seed_stability  # on the stand-in: Run strings the scans and the stability together
    run = PlantedRun()
    pairs, summary = seed_stability(run, "single_head", [0, 1, 2], n=3)
    assert [s for _, s, _ in run.scanned] == [0, 1, 2]
    assert [name for *_, name in run.scanned] == ["ioi_seed0", "ioi_seed1", "ioi_seed2"]  # each seed's own folder
    assert summary["tops"] == {0: ["a", "b", "c"], 1: ["a", "b", "c"], 2: ["a", "b", "d"]}
    assert pairs["overlap"].tolist() == pytest.approx([1.0, 2 / 3, 2 / 3])
    assert summary["mean_overlap"] == pytest.approx(7 / 9) and summary["min_overlap"] == pytest.approx(2 / 3)
    assert seed_stability(run, "single_head", [0, 1])[1]["n"] == 1  # default n: 5% of 4 masks, at least one
    # logit_diff's damage is its decrease: the same deltas rank the other way round
    table = pd.DataFrame({"mask": list("abcd"), "delta_logit_diff": [4.0, 3.0, 2.0, 1.0], "metric": "logit_diff"})
    assert top_heads(table, 2) == ["d", "c"]
    with pytest.raises(ConfigError, match="task.source"):
        seed_stability(PlantedRun("file"), "single_head", [0, 1])
    with pytest.raises(ConfigError, match="seeds"):
        seed_stability(run, "single_head", [3, 3])


def test_the_few_heads_claim_names_the_top_heads_stability():
    from test_findings_behaviour import top_table

    from headcount.findings.ioi_heads import few_heads_claim

    stability = {"top_n": 2, "mean_overlap": 0.875, "min_overlap": 0.5, "resamples": 1000}
    claim, numbers = few_heads_claim(top_table(0.6, [0.02, 0.05]), stability)
    assert claim.measured.endswith(
        "the top 2 of single heads by damage hold on average 88% of their places (lowest 50%) over 1000 bootstrap "
        "resamples"
    )
    assert numbers["top_heads_bootstrap_overlap"] == 0.875 and claim.verdict == "reproduced"
    unstable, _ = few_heads_claim(top_table(0.6, [0.02, 0.05]), stability | {"mean_overlap": 0.5})
    assert unstable.verdict == "partly" and "unstable (under 80%)" in unstable.measured
    assert "bootstrap" not in few_heads_claim(top_table(0.6, [0.02, 0.05]), "not computed: ...")[0].measured
