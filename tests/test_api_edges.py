"""Run.evaluate with edges (headcount/api_edges.py) and the edge_attribution scan's circuit choice: removing one edge
gives the scan's exact score and path patching's effect (float32 and float64), a circuit gives the scan's
faithfulness, no edge removed is run.evaluate's baseline, every edge removed is the corrupted run computed by hand,
on the run's data and on a task in patch mode; bad input is one line and nothing is written. The drawn circuit is
chosen by exact scores where every edge has one, says so, and otherwise by EAP-IG."""

import json
from pathlib import Path

import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

import headcount
from headcount.ablation.scans import edge_attribution
from headcount.ablation.session import AblationSession
from headcount.circuits import Graph, NodeOutputs, PointMetric, draw_circuit, node_outputs, path_patch, top_edges
from headcount.cli.train import run as train
from headcount.config import CONF_DIR
from headcount.errors import ConfigError
from headcount.io import atomic_savefig
from headcount.run_dir import RunPaths

SMOKE = ["model=tiny", "data=induction", "trainer=smoke", "logger=none", "ablation.progress=false"]
SMOKE += ["data.n_train=64", "data.n_val=24", "data.n_test=16", "data.seq_len=32", "ablation.n_reference=16"]
SMOKE += ["ablation.batch_size=10"]  # three eval batches, the last one short: the edges' inputs join them
SCAN = {"steps": 1, "circuit_size": 12, "circuit_sizes": [12], "random_sets": 1}
PROMPTS = [
    {"prompt": [0, 5, 9, 4, 5], "answer": 9, "wrong": 4, "corrupted": [0, 5, 7, 4, 5]},
    {"prompt": [0, 3, 8, 2, 6, 3], "answer": 8, "wrong": 2, "corrupted": [0, 3, 1, 2, 6, 3]},
    {"prompt": [0, 11, 12, 13, 11], "answer": 12, "wrong": 13, "corrupted": [0, 11, 14, 13, 11]},
]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("api_edges") / "run"
    GlobalHydra.instance().clear()
    with initialize_config_dir(CONF_DIR, version_base="1.3"):
        cfg = compose("train", overrides=[*SMOKE, "ablation=[baseline]"])
    train(cfg, run_dir)
    RunPaths(run_dir).config.parent.mkdir()
    OmegaConf.save(cfg, RunPaths(run_dir).config)
    (run_dir.parent / "prompts.jsonl").write_text("".join(json.dumps(row) + "\n" for row in PROMPTS))
    return run_dir


@pytest.fixture(scope="module")
def run(run_dir) -> headcount.Run:
    return headcount.load_run(run_dir, device="cpu")


def exact_scan(run: headcount.Run) -> pd.DataFrame:
    """Every edge scored exactly by the edge_attribution scan (zero mode): computed once, then read back (and computed
    again where another test's scan of other settings replaced it)."""
    return run.scan("edge_attribution", mode="zero", exact_all=True, **SCAN)


def files_of(run_dir: Path) -> list[Path]:
    return sorted(p for p in run_dir.rglob("*") if "logs" not in p.parts)


def test_removing_one_edge_gives_the_scans_exact_score(run):
    scan = exact_scan(run)
    edges = list(scan["edge"])
    table = run.evaluate(edges_removed={edge: [edge] for edge in edges}, mode="zero")
    assert list(table["mask"]) == edges and table["n_edges_removed"].eq(1).all()
    exact = torch.tensor(scan["exact"].to_numpy())
    torch.testing.assert_close(torch.tensor(table["delta_loss"].to_numpy()), exact, rtol=1e-5, atol=1e-8)
    assert exact.abs().max() > 1e-3  # edges that matter, not all zeros
    assert {"loss", "acc", "delta_acc", "faithfulness", "metric", "split", "n_targets"} <= set(table.columns)


def test_a_circuit_gives_the_scans_faithfulness(run, run_dir):
    scan = exact_scan(run)
    circuit = list(scan.loc[scan["in_circuit"], "edge"])
    table = run.evaluate(circuit={"drawn": circuit, "every edge": list(scan["edge"])}, mode="zero")
    summary = json.loads((RunPaths(run_dir).ablation / "summary.json").read_text())
    entry = summary["modes"]["zero"]["edge_circuits"]["edge_attribution"]
    assert entry["circuit_edges"] == len(circuit) > 0
    assert table["faithfulness"].iloc[0] == pytest.approx(entry["circuit_faithfulness"], rel=1e-5, abs=1e-7)
    assert table["faithfulness"].iloc[1] == pytest.approx(1.0, abs=1e-6)  # every edge kept: the clean model
    assert table["delta_loss"].iloc[1] == pytest.approx(0.0, abs=1e-6)
    assert list(table["n_edges_removed"]) == [len(scan) - len(circuit), 0]


def test_no_edge_removed_is_the_baseline_and_every_edge_removed_the_corrupted_run(run):
    heads = run.evaluate(["L0H0"], mode="resample")
    baseline = heads["loss"].iloc[0] - heads["delta_loss"].iloc[0]
    table = run.evaluate(edges_removed={"none": [], "all": list(Graph.of(run.model).edge_index)}, mode="resample")
    none, every = table.iloc[0], table.iloc[1]
    assert none["loss"] == pytest.approx(baseline, rel=1e-6) and none["delta_loss"] == 0.0
    assert none["faithfulness"] == 1.0 and every["faithfulness"] == pytest.approx(0.0, abs=1e-12)
    # by hand: the model run on each example's resampled source, read at the clean example's targets
    session = session_of(run, "resample")
    losses, points = [], 0
    with torch.no_grad():
        for batch in session.batches:
            where = torch.zeros_like(batch["input_ids"], dtype=torch.bool)
            where[:, :-1] = batch["loss_mask"][:, 1:].bool()
            logits = run.model(batch["source_ids"])[where]
            answers = batch["input_ids"][:, 1:][where[:, :-1]]
            losses.append(F.cross_entropy(logits.double(), answers, reduction="sum"))
            points += int(where.sum())
    assert every["loss"] == pytest.approx(float(sum(losses)) / points, rel=1e-5)
    assert every["n_edges_removed"] == len(Graph.of(run.model).edges) and every["reference_split"] == "train"


def session_of(run: headcount.Run, mode: str) -> AblationSession:
    config = run.config.copy()
    config.ablation.mode = mode
    config.ablation.scans = {}
    return AblationSession(config, run.path)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_one_edge_removed_equals_path_patching_of_that_edge(run_dir, dtype):
    """Against the circuits core's other engine (path patching), on inputs and a metric built here."""
    run = headcount.load_run(run_dir, device="cpu")
    run.model.to(dtype)
    edges = ["L0H3 -> L1H2.k", "emb -> L1H0.q", "L0H1 -> L1.mlp", "L1.mlp -> logits"]
    table = run.evaluate(edges_removed={edge: [edge] for edge in edges}, mode="zero")
    ids = torch.cat([b["input_ids"] for b in run.eval_batches])
    where = torch.zeros_like(ids, dtype=torch.bool)
    where[:, :-1] = torch.cat([b["loss_mask"] for b in run.eval_batches])[:, 1:].bool()
    answers = ids[:, 1:][where[:, :-1]]
    clean = node_outputs(run.model, ids)
    zero = NodeOutputs(clean.emb * 0, [z * 0 for z in clean.z], [m * 0 for m in clean.mlp])
    metric = PointMetric(lambda logits, answer: F.cross_entropy(logits, answer, reduction="none"), answers)
    pairs = [([edge.split(" -> ")[0]], [edge.split(" -> ")[1]]) for edge in edges]
    effects = path_patch(run.model, ids, zero, pairs, metric, where) / len(answers)
    tolerance = {"rtol": 1e-10, "atol": 1e-12} if dtype == torch.float64 else {"rtol": 1e-4, "atol": 1e-7}
    torch.testing.assert_close(torch.tensor(table["delta_loss"].to_numpy()), effects.double(), **tolerance)
    assert effects.abs().max() > 1e-4


@pytest.mark.parametrize("direction", ["noise", "denoise"])
def test_a_task_in_patch_mode_every_edge_removed_closes_the_gap(run, run_dir, direction):
    """Noising runs the clean prompts with the corrupted ones' outputs along removed edges, denoising the reverse:
    either way every edge removed is the counterpart run, the whole gap."""
    prompts = str(run_dir.parent / "prompts.jsonl")
    every = list(Graph.of(run.model).edge_index)
    how = {"mode": "patch", "metric": "logit_diff", "task": prompts, "patch_direction": direction}
    table = run.evaluate(circuit={"none": [], "all": every}, **how)
    masks = run.evaluate(["L0H0"], **how)
    none, all_kept = table.iloc[0], table.iloc[1]
    assert none["gap_fraction"] == pytest.approx(1.0, abs=1e-5) and none["faithfulness"] == 0.0
    assert all_kept["gap_fraction"] == 0.0 and all_kept["faithfulness"] == 1.0
    baseline = masks["logit_diff"].iloc[0] - masks["delta_logit_diff"].iloc[0]
    assert all_kept["logit_diff"] == pytest.approx(baseline, rel=1e-5, abs=1e-6)
    assert set(table["task"]) == {"prompts"} and set(table["metric"]) == {"logit_diff"}
    assert list(table["n_targets"]) == [3, 3] and set(table["split"]) == {
        "prompts" if direction == "noise" else "corrupted"
    }
    assert abs(none["delta_logit_diff"]) > 1e-3  # the prompts' gap is no zero


BAD = [
    ({"edges_removed": ["L0H9 -> L1H2.k"]}, "edges_removed='L0H9 -> L1H2.k': L0H9: no such node in this model"),
    ({"edges_removed": ["L0H9 -> L1H2.k"]}, "did you mean 'L0H3'?"),
    ({"circuit": ["L1H2 -> L0H3.k"]}, "circuit='L1H2 -> L0H3.k': L0H3.k does not read L1H2: a receiver must come"),
    ({"circuit": ["L0H3 => L1H2.k"]}, "circuit='L0H3 => L1H2.k': an edge is written 'sender -> receiver'"),
    ({"edges_removed": ["L0H3 -> L1H2.x"]}, "a head's input suffix must be .q, .k or .v, not .x"),
    ({"edges_removed": {"a": [3]}}, "edges_removed=[3]: a list of edge names such as"),
    ({"edges_removed": ["L0H3 -> L1H2.k"], "mode": "mean"}, "mode='mean': evaluating edges_removed needs every"),
    ({"masks": ["L0H0"], "circuit": []}, "evaluate='masks, circuit': give exactly one of masks, edges_removed="),
    ({"circuit": {}}, "circuit={}: give at least one edge set"),
]


@pytest.mark.parametrize("kwargs, message", BAD, ids=[b[1][:40] for b in BAD])
def test_bad_edges_are_one_line_and_write_nothing(run, run_dir, kwargs, message):
    before = files_of(run_dir)
    with pytest.raises(ConfigError) as error:
        run.evaluate(**kwargs)
    assert message in str(error.value) and "\n" not in str(error.value), str(error.value)
    assert files_of(run_dir) == before


def test_evaluating_edges_writes_nothing(run, run_dir):
    before = files_of(run_dir)
    run.evaluate(circuit=["emb -> logits"], mode="zero")
    assert files_of(run_dir) == before


# --- the edge_attribution scan's circuit ----------------------------------------------------------------------------


def test_the_circuit_is_chosen_by_exact_scores_where_every_edge_has_one(run, run_dir):
    """verify_top_k covering every edge (exact_all off) gives every edge an exact score: the circuit is the top
    circuit_size by |exact|, which differs from EAP-IG's here (the earlier rule chose by EAP-IG unless exact_all)."""
    graph = Graph.of(run.model)
    table = run.scan("edge_attribution", mode="zero", verify_top_k=len(graph.edges), **SCAN)
    assert table["verified"].all() and set(table["circuit_by"]) == {"exact"}
    exact = torch.tensor(table["exact"].to_numpy())
    by_exact = {graph.edges[i].name for i in top_edges(graph, exact, SCAN["circuit_size"])}
    by_eap_ig = {graph.edges[i].name for i in top_edges(graph, torch.tensor(table["eap_ig"].to_numpy()), 12)}
    assert set(table.loc[table["in_circuit"], "edge"]) == by_exact != by_eap_ig
    summary = json.loads((RunPaths(run_dir).ablation / "summary.json").read_text())
    assert summary["modes"]["zero"]["edge_circuits"]["edge_attribution"]["circuit_by"] == "exact"
    curve = pd.read_csv(RunPaths(run_dir).ablation / "edge_attribution_faithfulness.csv")
    assert "exact" in set(curve["method"])


def test_exact_scores_of_some_edges_leave_the_choice_to_eap_ig(run, run_dir):
    graph = Graph.of(run.model)
    table = run.scan("edge_attribution", mode="zero", receivers=["L1"], exact_all=True, **SCAN)
    assert table["verified"].all() and len(table) < len(graph.edges)
    assert set(table["circuit_by"]) == {"eap_ig"}
    summary = json.loads((RunPaths(run_dir).ablation / "summary.json").read_text())
    assert summary["modes"]["zero"]["edge_circuits"]["edge_attribution"]["circuit_by"] == "eap_ig"


def test_the_circuit_figure_names_its_score_and_faithfulness_and_dashes_edges_that_help(run, monkeypatch):
    drawn, saved = {}, {}

    def keep(graph, circuit, weights, title):
        drawn.update(circuit=circuit, weights=weights, title=title)
        return draw_circuit(graph, circuit, weights, title)

    def save(fig, path, **kwargs):
        saved[Path(path).name] = fig
        return atomic_savefig(fig, path, **kwargs)

    monkeypatch.setattr(edge_attribution, "draw_circuit", keep)
    monkeypatch.setattr(edge_attribution, "atomic_savefig", save)
    (RunPaths(run.path).ablation / "edge_attribution.csv").unlink(missing_ok=True)  # computed again, drawn
    table = run.scan("edge_attribution", mode="zero", exact_all=True, **SCAN)
    entry = json.loads((RunPaths(run.path).ablation / "summary.json").read_text())["modes"]["zero"]["edge_circuits"]
    faithfulness = entry["edge_attribution"]["circuit_faithfulness"]
    assert f"edges by |exact| (nats), faithfulness {faithfulness:.2f}" in drawn["title"]
    star = [line for line in saved["edge_attribution_faithfulness.png"].axes[0].lines if "drawn" in line.get_label()]
    assert [line.get_label() for line in star] == ["drawn circuit (by exact)"]
    assert list(star[0].get_xdata()) == [SCAN["circuit_size"]] and list(star[0].get_ydata()) == [faithfulness]
    graph = Graph.of(run.model)
    assert drawn["circuit"] == {graph.edge_index[e] for e in table.loc[table["in_circuit"], "edge"]}
    signed = dict(zip(table["edge"], table["exact"]))  # loss: a positive exact score is damage
    assert all(float(drawn["weights"][graph.edge_index[e]]) == pytest.approx(v) for e, v in signed.items())
    fig = draw_circuit(graph, set(range(len(graph.edges))), drawn["weights"])  # every edge: both signs occur
    styles = {p.get_gid(): p.get_linestyle() for p in fig.axes[0].patches if p.get_gid()}
    assert {"-", "--"} <= set(styles.values())
    assert all((styles[e] == "--") == (signed[e] < 0) for e in styles)
    assert "removing it helps" in [t.get_text() for t in fig.axes[0].get_legend().get_texts()]


def test_circuit_performance_of_a_brought_ranking_is_the_scans_cpr(run, run_dir):
    scan = exact_scan(run)
    exact = dict(zip(scan["edge"], scan["exact"]))
    by_order = list(scan.loc[scan["exact"].abs().sort_values(ascending=False, kind="stable").index, "edge"])
    table = run.circuit_performance({"exact": exact, "listed": by_order}, mode="zero")
    areas = pd.read_csv(RunPaths(run_dir).ablation / "edge_attribution_cpr.csv")
    expected = areas[areas["method"] == "exact"].iloc[0]
    row = table.set_index("method").loc["exact"]
    assert (row["cpr"], row["cmd"]) == pytest.approx((expected["cpr"], expected["cmd"]), rel=1e-5, abs=1e-7)
    assert table.set_index("method").loc["listed", "cpr"] == pytest.approx(row["cpr"], rel=1e-5, abs=1e-7)
    assert row["f_100%"] == pytest.approx(1.0, abs=1e-6) and row["edges_100%"] == len(scan)
    assert {"f_0.1%", "f_50%", "edges_0.1%", "mode", "metric", "n_targets"} <= set(table.columns)
    # the scan's intervals: the same resamples (the run's seed) of the same prompts
    assert (row["cpr_ci_low"], row["cmd_ci_high"]) == pytest.approx(
        (expected["cpr_ci_low"], expected["cmd_ci_high"]), rel=1e-5, abs=1e-7
    )
    single = run.circuit_performance(by_order[:5], mode="zero", resamples=0)
    assert "cpr_ci_low" not in single.columns
    assert list(single["method"]) == ["ranking"] and single["edges_100%"].iloc[0] == len(scan)
    with pytest.raises(ConfigError, match=r"scores='L0H9 -> logits': L0H9: no such node"):
        run.circuit_performance(["L0H9 -> logits"], mode="zero")
    with pytest.raises(ConfigError, match="an edge ranking"):
        run.circuit_performance({"mine": "L0H0 -> logits"}, mode="zero")  # a string, not a ranking
