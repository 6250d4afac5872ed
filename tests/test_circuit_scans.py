"""The circuit scans (path_patching, edge_attribution) on a tiny trained run: their tables equal the circuits core
called directly on the same model and prompts (with an independent metric), a rerun reads them back, bad input is
one line with exit code 2 and nothing written, and a planted wrong sign is caught."""

import json
from pathlib import Path

import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from sweep_helpers import SMOKE, command_in_process, one_line, train_in_process

import headcount
from headcount.ablation.scans import edge_attribution, path_patching
from headcount.circuits import (
    NodeOutputs,
    PointMetric,
    eap_ig_scores,
    eap_scores,
    exact_edge_scores,
    node_outputs,
    path_patch,
)
from headcount.cli import ablate as ablating
from headcount.run_dir import RunPaths

QUIET = ["ablation.progress=false", "trainer.progress_bar=false"]
PATHS = {"senders": ["L0H0", "L0H1"], "receivers": ["L1H0.k", "L1H1.q"], "receivers_together": False}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("circuit_scans")
    mp = pytest.MonkeyPatch()
    try:
        assert train_in_process(mp, root, [*SMOKE, *QUIET, "ablation=[baseline]", "hydra.run.dir=run"]) == 0
    finally:
        mp.undo()
    return root / "run"


def reference_inputs(run: "Reference", mode: str) -> tuple:
    """The validation split's ids, the corrupted run, the score points and the loss summed over them, built here
    from the data, not through the scans' helpers."""
    model = run.model
    ids, loss_mask = run.examples["input_ids"], run.examples["loss_mask"]
    where = torch.zeros_like(ids, dtype=torch.bool)
    where[:, :-1] = loss_mask[:, 1:].bool()
    answers = ids[:, 1:][where[:, :-1]]
    if mode == "zero":
        clean = node_outputs(model, ids)
        corrupted = NodeOutputs(clean.emb * 0, [z * 0 for z in clean.z], [m * 0 for m in clean.mlp])
    else:
        corrupted = run.examples["source_ids"]
    metric = PointMetric(lambda logits_PV, answer_P: F.cross_entropy(logits_PV, answer_P, reduction="none"), answers)
    return ids, corrupted, where, metric, int(where.sum())


class Reference:
    """The run's model and validation prompts, loaded as the session loads them."""

    def __init__(self, run_dir: Path, mode: str):
        from omegaconf import OmegaConf

        from headcount.ablation.session import AblationSession

        config = OmegaConf.load(RunPaths(run_dir).config)
        config.ablation.mode = mode
        config.ablation.scans = {}
        self.session = AblationSession(config, run_dir)
        self.model = self.session.model
        batches = self.session.batches
        self.examples = {k: torch.cat([b[k] for b in batches]) for k in batches[0] if k in ("input_ids", "loss_mask")}
        if "source_ids" in batches[0]:
            self.examples["source_ids"] = torch.cat([b["source_ids"] for b in batches])


def assert_matches(table: pd.DataFrame, column: str, expected: torch.Tensor, n_points: int) -> None:
    torch.testing.assert_close(torch.tensor(table[column].to_numpy()), expected / n_points, rtol=1e-5, atol=1e-9)


@pytest.mark.parametrize("mode", ["zero", "resample"])
def test_path_patching_table_is_the_core_on_the_same_prompts(run_dir, mode):
    table = headcount.load_run(run_dir).scan("path_patching", mode=mode, **PATHS)
    reference = Reference(run_dir, mode)
    ids, corrupted, where, metric, n = reference_inputs(reference, mode)
    pairs = [([s], [r]) for r in PATHS["receivers"] for s in PATHS["senders"]]
    assert list(zip(table["sender"], table["receivers"])) == [(s[0], r[0]) for s, r in pairs]
    effects = path_patch(reference.model, ids, corrupted, pairs, metric, where)
    assert_matches(table, "effect", effects, n)
    assert table["mode"].eq(mode).all() and table["metric"].eq("loss").all()  # the standard trailing columns


def test_edge_attribution_table_is_the_core_and_a_rerun_reads_it_back(run_dir, monkeypatch):
    run = headcount.load_run(run_dir)
    table = run.scan("edge_attribution", mode="zero", exact_all=True, steps=3, circuit_size=8, random_sets=2)
    reference = Reference(run_dir, "zero")
    ids, corrupted, where, metric, n = reference_inputs(reference, "zero")
    model = reference.model
    assert_matches(table, "eap", eap_scores(model, ids, corrupted, metric, where), n)
    assert_matches(table, "eap_ig", eap_ig_scores(model, ids, corrupted, metric, 3, where), n)
    exact = exact_edge_scores(model, ids, corrupted, metric, where)
    assert_matches(table, "exact", exact, n)
    assert table["in_circuit"].sum() <= 8 and table["verified"].all()
    ablation = RunPaths(run_dir).ablation
    curve = pd.read_csv(ablation / "edge_attribution_faithfulness.csv")
    assert set(curve["method"]) == {"eap", "eap_ig", "exact", "random"}
    full = curve[curve["n"] == len(table)]
    assert torch.allclose(torch.tensor(full["faithfulness"].to_numpy()), torch.ones(len(full), dtype=torch.float64))
    zero = json.loads((ablation / "summary.json").read_text())["modes"]["zero"]
    assert set(zero["edge_attribution"]["edge_attribution"]["eap"]) == {"spearman", "top_10_recall"}
    assert zero["edge_circuits"]["edge_attribution"]["circuit_edges"] <= 8
    for png in ("edge_attribution_faithfulness.png", "edge_attribution_circuit.png"):
        assert (ablation / png).stat().st_size > 0

    def recompute(*args):
        raise AssertionError("an up-to-date scan was computed again")

    monkeypatch.setattr(edge_attribution.EdgeAttributionScan, "compute", recompute)
    again = run.scan("edge_attribution", mode="zero", exact_all=True, steps=3, circuit_size=8, random_sets=2)
    pd.testing.assert_frame_equal(again, table, check_dtype=False)


def test_a_planted_wrong_sign_fails_the_comparison(run_dir, monkeypatch):
    flipped = lambda *args, **kwargs: -path_patch(*args, **kwargs)  # noqa: E731
    monkeypatch.setattr(path_patching, "path_patch", flipped)
    (RunPaths(run_dir).ablation / "path_patching.resample.csv").unlink(missing_ok=True)  # computed again, flipped
    with pytest.raises(AssertionError):
        test_path_patching_table_is_the_core_on_the_same_prompts(run_dir, "resample")


BAD = [
    (["ablation=path_patching", "ablation.scans.path_patching.senders=[L0H9]"], "senders='L0H9': no such node"),
    (
        [
            "ablation=path_patching",
            "ablation.scans.path_patching.senders=[L1H0]",
            "ablation.scans.path_patching.receivers=[L0H1.k]",
        ],
        "receivers='L0H1.k': comes before its sender L1H0",
    ),
    (["ablation=edge_attribution", "ablation.scans.edge_attribution.steps=0"], "edge_attribution.steps=0: EAP-IG"),
    (["ablation=path_patching", "ablation.mode=mean"], "ablation.mode='mean': the path_patching scan needs"),
]


@pytest.mark.parametrize("args, message", BAD, ids=[b[1].split(":")[0] for b in BAD])
def test_bad_input_is_one_line_and_leaves_nothing(run_dir, monkeypatch, capsys, args, message):
    ablation = RunPaths(run_dir).ablation
    before = sorted(p for p in ablation.rglob("*") if "logs" not in p.parts)
    code = command_in_process(ablating.main, monkeypatch, run_dir.parent, [f"run_dir={run_dir}", *QUIET[:1], *args])
    assert code == 2
    assert message in one_line(capsys.readouterr().err)
    assert sorted(p for p in ablation.rglob("*") if "logs" not in p.parts) == before


@pytest.mark.parametrize(
    "k, q, other_k, expected",
    [
        (2.0, 0.5, 1.0, "reproduced"),
        (0.5, 2.0, 1.0, "partly"),
        (0.1, 0.1, 1.0, "not reproduced"),  # the largest edge from a layer-0 head is L0H1's, no previous-token head
        (0.5, 0.1, 3.0, "not reproduced"),
    ],
)
def test_the_k_composition_claim_reads_the_largest_head_edge_into_the_induction_head(k, q, other_k, expected):
    from headcount.findings.induction import composition_claim

    rows = [
        ("L0H3", "L1H2.k", k),
        ("L0H3", "L1H2.q", q),
        ("L0H3", "L1H2.v", 0.2),
        ("L0H1", "L1H2.k", other_k),
        ("L0H0", "L1H2.k", 1.0),
        ("emb", "L1H2.q", 9.0),  # the embeddings are no layer-0 head: not a candidate
        ("L0H3", "L1H0.k", 5.0),  # into another head
    ]
    edges = pd.DataFrame([{"edge": f"{s} -> {r}", "sender": s, "receiver": r, "exact": v} for s, r, v in rows])
    claim, numbers = composition_claim(edges, ["L0H3"], "L1H2")
    assert claim.verdict == expected
    assert numbers["prev_token_head_edges_into_induction_head"]["L0H3 -> L1H2.k"] == k


def test_the_k_composition_claim_takes_any_previous_token_head_as_the_sender():
    """Two layer-0 heads share the previous-token role: the largest edge into the induction head's key from either
    is K-composition (the rule of one previous-token head, the top scorer L0H3, said not reproduced)."""
    from headcount.findings.induction import composition_claim

    rows = [("L0H3", "L1H2.k", 0.4), ("L0H1", "L1H2.k", 3.0), ("L0H1", "L1H2.q", 0.1), ("L0H0", "L1H2.k", 1.0)]
    edges = pd.DataFrame([{"edge": f"{s} -> {r}", "sender": s, "receiver": r, "exact": v} for s, r, v in rows])
    claim, numbers = composition_claim(edges, ["L0H1", "L0H3"], "L1H2")
    assert claim.verdict == "reproduced"
    assert numbers["largest_head_edge_into_induction_head"] == "L0H1 -> L1H2.k"
    assert set(numbers["prev_token_head_edges_into_induction_head"]) == {
        "L0H1 -> L1H2.k",
        "L0H1 -> L1H2.q",
        "L0H3 -> L1H2.k",
    }
    assert composition_claim(edges, [], "L1H2")[0].verdict == "not reproduced"
