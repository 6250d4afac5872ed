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
    MIB_FRACTIONS,
    NodeOutputs,
    PointMetric,
    curve_areas,
    eap_ig_scores,
    eap_scores,
    exact_edge_scores,
    mib_sizes,
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
    # MIB's sizes are on the curve, and CPR and CMD are its areas there (circuits/cpr.py, by hand in tests/test_cpr.py)
    assert set(mib_sizes(len(table))) <= set(curve["n"])
    areas = pd.read_csv(ablation / "edge_attribution_cpr.csv")
    bounds = {"cpr_ci_low", "cpr_ci_high", "cmd_ci_low", "cmd_ci_high"}
    assert len(areas) == 3 + 2 and set(areas.columns) == {"method", "draw", "cpr", "cmd"} | bounds
    assert (areas["cpr_ci_low"] <= areas["cpr"] + 1e-12).all() and (areas["cpr"] <= areas["cpr_ci_high"] + 1e-12).all()
    assert (curve["ci_low"] <= curve["faithfulness"] + 1e-12).all() and (curve["ci_low"] < curve["ci_high"]).any()
    for (method, draw), rows in curve.groupby(["method", "draw"]):
        at = rows.set_index("n")["faithfulness"]
        f = [at[n] for n in mib_sizes(len(table))]
        expected = curve_areas(MIB_FRACTIONS, f)
        row = areas[(areas["method"] == method) & (areas["draw"] == draw)].iloc[0]
        assert (row["cpr"], row["cmd"]) == pytest.approx((expected["cpr"], expected["cmd"]), abs=1e-12)
    # every score's bootstrap interval holds it (the full data's value); the circuit's stability over resamples
    for method in ("eap", "eap_ig", "exact"):
        low, high = table[f"{method}_ci_low"], table[f"{method}_ci_high"]
        assert (low <= table[method] + 1e-12).all() and (table[method] <= high + 1e-12).all() and (low < high).any()
    stability = zero["edge_circuits"]["edge_attribution"]["stability"]
    assert stability["by"] == "exact" and stability["n"] == 8 and 0 < stability["min_overlap"] <= 1
    assert table["top_share"].between(0, 1).all() and table["top_share"].sum() == pytest.approx(8)
    mib = zero["edge_circuits"]["edge_attribution"]["mib"]
    exact_areas = areas[areas["method"] == "exact"].iloc[0]
    assert mib["exact"]["cpr"] == pytest.approx(float(exact_areas["cpr"]))
    assert mib["exact"]["cpr_ci_high"] == pytest.approx(float(exact_areas["cpr_ci_high"]))
    assert mib["random"]["cpr"] == pytest.approx(areas.loc[areas["method"] == "random", "cpr"].mean())
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


def composition_edges(rows: list[tuple[str, str, float]]) -> pd.DataFrame:
    return pd.DataFrame([{"edge": f"{s} -> {r}", "sender": s, "receiver": r, "exact": v} for s, r, v in rows])


@pytest.mark.parametrize(
    "k, q, v, expected",
    [
        (2.0, 0.5, 0.2, "reproduced"),
        (0.5, 2.0, 0.2, "not reproduced"),
        (0.5, 0.1, 0.9, "not reproduced"),
        (-0.1, -0.5, -0.2, "not reproduced"),
    ],
)
def test_the_k_composition_claim_sums_the_edges_between_the_two_roles_heads(k, q, v, expected):
    """The previous-token heads L0H1 and L0H3 share the role, the induction heads L1H2 and L1H0: each input's edges
    are summed over both roles' heads (L0H3's larger .q edge into L1H2 loses to the two roles' .k edges together);
    edges from other heads or the embeddings, or into a head of no role, do not count."""
    from headcount.findings.induction import composition_claim

    rows = [
        ("L0H1", "L1H2.k", k / 2),
        ("L0H3", "L1H0.k", k / 2),
        ("L0H3", "L1H2.q", q),
        ("L0H1", "L1H0.v", v),
        ("L0H0", "L1H2.q", 9.0),  # no previous-token head
        ("emb", "L1H2.q", 9.0),  # the embeddings
        ("L0H3", "L1H3.q", 5.0),  # into a head with no induction pattern
    ]
    claim, numbers = composition_claim(composition_edges(rows), ["L0H1", "L0H3"], ["L1H0", "L1H2"])
    assert claim.verdict == expected
    assert numbers["prev_to_induction_exact_by_input"] == pytest.approx({"q": q, "k": k, "v": v})
    assert numbers["prev_to_induction_edges"] == 4


def test_the_k_composition_claim_without_either_role_is_not_reproduced():
    edges = composition_edges([("L0H1", "L1H2.k", 3.0)])
    assert composition_claim_verdict(edges, [], ["L1H2"]) == "not reproduced"
    assert composition_claim_verdict(edges, ["L0H1"], []) == "not reproduced"
    assert composition_claim_verdict(edges, ["L0H1"], ["L1H2"]) == "reproduced"


def composition_claim_verdict(edges: pd.DataFrame, prev: list[str], induction: list[str]) -> str:
    from headcount.findings.induction import composition_claim

    return composition_claim(edges, prev, induction)[0].verdict
