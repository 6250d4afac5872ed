"""The circuit scans (path_patching, edge_attribution) on a tiny trained run: their tables equal the circuits core
called directly on the same model and prompts (with an independent metric), a rerun reads them back, bad input is
one line with exit code 2 and nothing written, and a planted wrong sign is caught."""

import hashlib
import json
from pathlib import Path

import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from sweep_helpers import ablate_unchanged, one_line, smoke_run

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
from headcount.run_dir import RunPaths

PATHS = {"senders": ["L0H0", "L0H1"], "receivers": ["L1H0.k", "L1H1.q"], "receivers_together": False}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return smoke_run(pytest.MonkeyPatch, tmp_path_factory.mktemp("circuit_scans"))


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
    for png in ("edge_attribution_faithfulness.png", "edge_attribution_circuit.png", "edge_attribution_intervals.png"):
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
    # issue 34: refused before the ranking's scan runs (nothing written), k checked, no name the user never wrote
    (
        [
            "ablation=path_patching",
            "ablation.scans.path_patching.senders=[top3:direct_effect]",
            "ablation.scans.path_patching.receivers=[L0H1.q]",
        ],
        "receivers='L0H1.q': reads no head, so none of the heads top3:direct_effect names can send to it",
    ),
    (
        ["ablation=path_patching", "ablation.scans.path_patching.senders=[top0:single_head]"],
        "senders='top0:single_head': k must be at least 1",
    ),
    (
        ["ablation=path_patching", "ablation.scans.path_patching.senders=[top99:single_head]"],
        "senders='top99:single_head': k must be at most the model's",
    ),
    (
        ["ablation=path_patching", "ablation.scans.path_patching.senders=[heads.v]"],
        "senders='heads.v': names heads' .v inputs, which receive",
    ),
]


@pytest.mark.parametrize("args, message", BAD, ids=[b[1].split(":")[0] for b in BAD])
def test_bad_input_is_one_line_and_leaves_nothing(run_dir, monkeypatch, capsys, args, message):
    assert ablate_unchanged(run_dir, monkeypatch, ["ablation.progress=false", *args]) == (2, True)
    assert message in one_line(capsys.readouterr().err)


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


EDGES = {"mode": "zero", "exact_all": True, "steps": 3, "circuit_size": 8, "random_sets": 2}


def test_every_file_of_an_edge_result_goes_through_the_cached_result_step(run_dir, monkeypatch):
    """edge_attribution wrote its curve and its summary section itself, and only a result's first file was hashed:
    a changed curve was read back as up to date. Now every file is recorded with its digest, a changed one computes
    the result again, and reading a result changes neither the table handed back nor the files."""
    run = headcount.load_run(run_dir)
    table = run.scan("edge_attribution", **EDGES)
    ablation = RunPaths(run_dir).ablation
    entry = json.loads((ablation / "summary.json").read_text())["modes"]["zero"]["scans"]["edge_attribution"]
    expected = ["edge_attribution.csv", "edge_attribution_faithfulness.csv", "edge_attribution_cpr.csv"]
    expected += ["edge_attribution_faithfulness.png", "edge_attribution_circuit.png", "edge_attribution_intervals.png"]
    assert entry["files"] == expected
    assert set(entry["digests"]) == set(expected)
    for name, digest in entry["digests"].items():
        assert hashlib.sha256((ablation / name).read_bytes()).hexdigest()[:16] == digest

    seen = []
    use = edge_attribution.EdgeAttributionScan.use

    def spied_use(self, given):
        before = given.copy()
        use(self, given)
        seen.append(given.equals(before))

    monkeypatch.setattr(edge_attribution.EdgeAttributionScan, "use", spied_use)
    curve = ablation / "edge_attribution_faithfulness.csv"
    before = {p.name: p.read_bytes() for p in ablation.glob("edge_attribution*.csv")}
    again = run.scan("edge_attribution", **EDGES)  # read back
    pd.testing.assert_frame_equal(again, table, check_dtype=False)
    assert seen == [True]  # use() read the table without changing it
    assert {p.name: p.read_bytes() for p in ablation.glob("edge_attribution*.csv")} == before

    curve.write_text(curve.read_text() + "eap,1,2.0\n")  # the second table changed after its record
    computed = []
    compute = edge_attribution.EdgeAttributionScan.compute
    monkeypatch.setattr(
        edge_attribution.EdgeAttributionScan, "compute", lambda self, key: computed.append(key) or compute(self, key)
    )
    run.scan("edge_attribution", **EDGES)
    assert len(computed) == 1
    assert curve.read_bytes() == before["edge_attribution_faithfulness.csv"]


def test_every_edge_exact_with_k_at_least_the_edges_keeps_the_spearman_and_says_why_no_recall(run_dir):
    """verify_top_k at least the number of edges, every edge exact, silently dropped EAP's and EAP-IG's Spearman
    from summary.json."""
    run = headcount.load_run(run_dir)
    table = run.scan("edge_attribution", mode="resample", verify_top_k=1000, steps=2, circuit_size=4, random_sets=1)
    assert table["verified"].all()
    section = json.loads((RunPaths(run_dir).ablation / "summary.json").read_text())["modes"]["resample"]
    entry = section["edge_attribution"]["edge_attribution"]
    for method in ("eap", "eap_ig"):
        ranks = table[method].abs().rank(), table["exact"].abs().rank()
        assert entry[method]["spearman"] == pytest.approx(float(ranks[0].corr(ranks[1])), rel=1e-9)
        why = entry[method]["top_1000_recall"]
        expected = f"not reported: verify_top_k=1000 is not below the {len(table)} edges, so the recall is 1.0 "
        assert why == expected + "whatever the scores"


def test_some_edges_exact_says_why_there_is_no_agreement(run_dir):
    run = headcount.load_run(run_dir)
    run.scan("edge_attribution", mode="resample", verify_top_k=3, steps=2, circuit_size=4, random_sets=1)
    section = json.loads((RunPaths(run_dir).ablation / "summary.json").read_text())["modes"]["resample"]
    entry = section["edge_attribution"]["edge_attribution"]
    assert entry["eap"].startswith("not reported: 3 of the ") and "exact_all scores all" in entry["eap"]


def test_a_path_patching_rerun_with_other_senders_says_it_replaces_the_table(run_dir, capsys):
    """A rerun with other senders or receivers replaced the table silently (only the first table's record kept).
    Chosen: one table per scan name, its replacement said in one line naming what changed, the earlier record
    (with its senders and receivers) kept under summary.json's `superseded`; two path sets side by side are two
    scans with names of their own (as ioi_circuit's s_inhibition and induction)."""
    run = headcount.load_run(run_dir)
    first = {"senders": ["L0H0"], "receivers": ["L1H0.q"]}
    run.scan("path_patching", mode="zero", **first)
    capsys.readouterr()
    run.scan("path_patching", mode="zero", senders=["L0H1"], receivers=["L1H0.q"])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "is replaced" in line]
    assert len(lines) == 1 and "path_patching.zero.csv" not in lines[0]  # zero mode keeps the plain name
    assert "senders: ['L0H0'] -> ['L0H1']" in lines[0] and "superseded" in lines[0], err
    summary = json.loads((RunPaths(run_dir).ablation / "summary.json").read_text())
    old = [s for s in summary["superseded"] if s.get("scan") == "path_patching" and s.get("mode") == "zero"]
    assert old[-1]["settings"]["senders"] == ["L0H0"]
    assert summary["modes"]["zero"]["scans"]["path_patching"]["settings"]["senders"] == ["L0H1"]
    capsys.readouterr()
    run.scan("path_patching", mode="zero", senders=["L0H1"], receivers=["L1H0.q"])  # up to date: nothing replaced
    assert "is replaced" not in capsys.readouterr().err


def test_edge_attribution_into_a_ranking_s_top_heads_runs_the_ranking_first(run_dir):
    """receivers: [top2:single_head.q] crashed (`'AblationSession' object has no attribute 'shared'`: the ranking was
    asked for while the session was still being set up). The ranking is a declared dependency (Scan.needs), run
    before the scan that reads it; the table holds exactly the edges into the two most damaging heads' queries."""
    run = headcount.load_run(run_dir)
    table = run.scan("edge_attribution", mode="zero", receivers=["top2:single_head.q"], steps=1, random_sets=0)
    single = run.results("single_head", mode="zero")
    single = single[single["n_heads_off"] == 1]
    top2 = single.sort_values("delta_loss", ascending=False, kind="stable")["mask"].head(2).tolist()
    assert sorted(set(table["receiver"])) == sorted(f"{head}.q" for head in top2)


def test_reading_a_result_never_changes_it(run_dir, monkeypatch):
    """records/results.py's reader changed the returned table in place; Scan.run hands `typed_table` (a new frame) to
    `use`, and neither changes the table it is given, computed or read back (every kind's own methods guarded)."""
    from headcount.ablation.scans import KINDS

    guarded = []

    def unchanged(method):
        def guard(self, table):
            before = table.copy(deep=True)
            out = method(self, table)
            pd.testing.assert_frame_equal(table, before)
            guarded.append(self.kind)
            return out

        return guard

    for kind in KINDS:
        for name in ("typed_table", "use", "handed_back"):
            if name in vars(KINDS[kind]):
                monkeypatch.setattr(KINDS[kind], name, unchanged(vars(KINDS[kind])[name]))
    run = headcount.load_run(run_dir)
    for _ in range(2):  # computed, then read back
        run.scan("edge_attribution", mode="resample", verify_top_k=2, steps=1, circuit_size=2, random_sets=0)
        run.scan("path_patching", mode="resample", **PATHS)
        run.scan("pairs", mode="resample", top_k=2)
    assert {"edge_attribution", "path_patching", "single_head"} <= set(guarded)
