"""The columns the scans and findings derive from the core's numbers, each computed here independently from the model
or from the table's own raw columns (issue 33 item 8: each planted x1.01 or flipped sign passed every test before):
a mask's gap_fraction, head_circuit's faithfulness, path_patching's damage and rank, the induction finding's joint
zeroing increase, Run.evaluate(edges...)'s second metric column."""

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from sweep_helpers import smoke_run

import headcount
from headcount.findings.induction import zeroing_together
from headcount.model.intervention import gated
from headcount.run_dir import load_run as open_finished_run

PROMPTS = [
    {"prompt": [0, 5, 9, 4, 5], "answer": 9, "wrong": 4, "corrupted": [0, 5, 7, 4, 5]},
    {"prompt": [0, 3, 8, 2, 6, 3], "answer": 8, "wrong": 2, "corrupted": [0, 3, 1, 2, 6, 3]},
    {"prompt": [0, 11, 12, 13, 11], "answer": 12, "wrong": 13, "corrupted": [0, 11, 14, 13, 11]},
]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("derived")
    run = smoke_run(pytest.MonkeyPatch, root)
    (root / "prompts.jsonl").write_text("".join(json.dumps(row) + "\n" for row in PROMPTS))
    return run


@pytest.fixture
def run(run_dir, tmp_path) -> headcount.Run:
    return headcount.load_run(shutil.copytree(run_dir, tmp_path / "run"), device="cpu")


def logit_diff_by_hand(model, prompts: list[list[int]]) -> float:
    """The mean over prompts of logit(answer) - logit(wrong) at each prompt's last token, one prompt at a time."""
    values = []
    with torch.no_grad():
        for ids, row in zip(prompts, PROMPTS):
            logits = model(torch.tensor([ids]))[0, -1].double()
            values.append(float(logits[row["answer"]] - logits[row["wrong"]]))
    return sum(values) / len(values)


def test_gap_fraction_is_the_delta_over_the_clean_to_corrupted_gap(run, run_dir):
    """scans/mask_scan.py's gap_fraction (what ioi_heads reports): delta / (m(corrupted prompts) - m(clean prompts))
    of the metric, both ends computed here by running the model on each prompt."""
    task = {"source": "file", "path": str(run_dir.parent / "prompts.jsonl")}
    table = run.evaluate({"one": ["L0H0"], "two": ["L0H1", "L1H2"]}, mode="patch", metric="logit_diff", task=task)
    clean = logit_diff_by_hand(run.model, [row["prompt"] for row in PROMPTS])
    corrupted = logit_diff_by_hand(run.model, [row["corrupted"] for row in PROMPTS])
    assert (table["logit_diff"] - table["delta_logit_diff"]).tolist() == pytest.approx([clean, clean], rel=1e-5)
    expected = table["delta_logit_diff"] / (corrupted - clean)
    assert table["gap_fraction"].tolist() == pytest.approx(expected.tolist(), rel=1e-5)
    assert table["gap_fraction"].abs().max() > 1e-3  # not trivially zero


def test_head_circuit_faithfulness_is_kept_against_none_kept_over_clean_against_none_kept(run):
    """scans/head_circuit.py's faithfulness: (M(kept) - M(no head kept)) / (M(clean) - M(no head kept)), each M
    here from Run.evaluate's masks (every head but the kept ones off; every head off; none off)."""
    table = run.scan("head_circuit", heads=["L0H0", "L1H1"], random_sets=2)
    heads = [(layer, head) for layer, n in enumerate(run.model.heads_per_layer) for head in range(n)]

    def loss_with_kept(kept: list[tuple[int, int]]) -> float:
        return float(run.evaluate({"m": [h for h in heads if h not in kept]})["loss"].iloc[0])

    probe = run.evaluate({"any": [heads[0]]})
    clean = float(probe["loss"].iloc[0] - probe["delta_loss"].iloc[0])
    none_kept = loss_with_kept([])
    circuit = table[table["mask"].str.startswith("circuit: ")].iloc[0]
    expected = (loss_with_kept([(0, 0), (1, 1)]) - none_kept) / (clean - none_kept)
    assert circuit["faithfulness"] == pytest.approx(expected, rel=1e-6)
    for row in table[table["mask"].str.startswith("random ")].itertuples():
        kept = [tuple(int(x) for x in name[1:].split("H")) for name in row.kept.split()]
        assert row.faithfulness == pytest.approx((loss_with_kept(kept) - none_kept) / (clean - none_kept), rel=1e-6)


def test_path_patching_damage_and_rank_follow_the_effect(run):
    """scans/path_patching.py's damage: how much a path worsens the metric, for loss its increase, the effect itself;
    rank 1 the largest damage."""
    table = run.scan("path_patching", mode="zero", senders=["L0H0", "L0H1", "emb"], receivers=["L1"])
    assert table["damage"].tolist() == table["effect"].tolist()  # loss: higher is worse
    by_hand = table["effect"].rank(ascending=False, method="first").astype(int)
    assert table["rank"].tolist() == by_hand.tolist()
    assert table.loc[table["rank"] == 1, "effect"].iloc[0] == table["effect"].max()
    logit = run.scan("path_patching", mode="zero", senders=["L0H0", "L0H1"], receivers=["L1"], metric="top1")
    assert logit["damage"].tolist() == (-logit["effect"]).tolist()  # a metric where higher is better


def test_the_induction_findings_joint_increase_is_the_loss_with_the_heads_zeroed_minus_the_repeated_loss(run_dir):
    """findings/induction.py's joint zeroing increase, computed here by one forward per batch with the heads' gates
    at 0 and the loss read where each batch's loss_mask marks the target."""
    finished = open_finished_run(run_dir)
    repeated = 1.25  # any reference: the increase is measured from it
    increase = zeroing_together(finished, repeated)
    heads = [(0, 1), (1, 0)]
    gates_LH = torch.ones(finished.model.n_layers, finished.model.max_heads)
    for layer, head in heads:
        gates_LH[layer, head] = 0.0
    total, points = 0.0, 0
    with torch.no_grad():
        for batch in finished.eval_batches():
            ids, mask = batch["input_ids"], batch["loss_mask"].bool()
            logits = finished.model(ids, gated(gates_LH)).double()
            losses = F.cross_entropy(logits[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none")
            total += float(losses[mask[:, 1:]].sum())
            points += int(mask[:, 1:].sum())
    assert increase(heads) == pytest.approx(total / points - repeated, rel=1e-6)
    assert increase([]) == 0.0


def test_evaluating_edges_reads_each_metric_column_from_its_own_values(run):
    """api_edges.py: each column of the metric is its own pass over the rows; acc read from the loss column passed.
    No edge removed is the clean model: its loss and acc are the evaluator's baseline, and every row's acc is a
    share of the points."""
    probe = run.evaluate({"any": ["L0H0"]}, mode="zero")
    baseline = {c: float(probe[c].iloc[0] - probe[f"delta_{c}"].iloc[0]) for c in ("loss", "acc")}
    table = run.evaluate(edges_removed={"none": [], "one": ["L0H0 -> L1H0.q"]}, mode="zero")
    none = table.iloc[0]
    assert none["loss"] == pytest.approx(baseline["loss"], rel=1e-6)
    assert none["acc"] == pytest.approx(baseline["acc"], rel=1e-6)
    assert table["acc"].between(0, 1).all()
    assert (table["delta_acc"] == table["acc"] - none["acc"]).all()


def test_the_test_sees_a_gap_fraction_planted_one_percent_off(run, run_dir, monkeypatch):
    """The comparison above is sharp enough: gap_fraction x1.01 fails it."""
    import headcount.ablation.scans.mask_scan as mask_scan

    scan_table = mask_scan.scan_table

    def planted(*args, **kwargs) -> pd.DataFrame:
        table = scan_table(*args, **kwargs)
        if "gap_fraction" in table:
            table["gap_fraction"] *= 1.01
        return table

    monkeypatch.setattr("headcount.api.scan_table", planted)
    with pytest.raises(AssertionError):
        test_gap_fraction_is_the_delta_over_the_clean_to_corrupted_gap(run, run_dir)
