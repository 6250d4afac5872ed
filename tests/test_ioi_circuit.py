"""The ioi_circuit experiment (issue 28): its claims' verdicts on made-up tables; the experiment at smoke size, each
scan reading the one before (a path_patching scan's top sender heads by its name, skip_unreached, every head as
senders, attention from S2) with every claim evaluated; a kept head circuit's faithfulness equal to the edge-patched
forward's with every other head's out-edges removed (float32 and float64); bad input as one line."""

import json
from pathlib import Path

import pandas as pd
import pytest
import torch
from sweep_helpers import command_in_process, one_line, train_in_process

from headcount.ablation.scans.circuit_inputs import top_sender_heads
from headcount.ablation.scans.intervals import score_intervals
from headcount.circuits import Graph, edge_metric, node_outputs
from headcount.cli import ablate as ablating
from headcount.config.model import AttentionConfig, ModelConfig
from headcount.findings import check_finding
from headcount.findings.claims import VERDICTS
from headcount.findings.ioi_circuit import (
    faithfulness_claim,
    induction_claim,
    name_movers_claim,
    s_inhibition_claim,
)
from headcount.model import Transformer
from headcount.model.intervention import gated, reads
from headcount.run_dir import RunPaths

HEADS = ["L2H0", "L2H1", "L1H0"]


def attention(rows: dict[str, dict[str, float]]) -> pd.DataFrame:
    """A position_attention table: one row per head named in rows, its attention to each named position."""
    records = []
    for name, shares in rows.items():
        layer, head = (int(x) for x in name[1:].split("H"))
        base = {"attn_to_IO": 0.0, "attn_to_S1": 0.0, "attn_to_S1+1": 0.0, "attn_to_S2": 0.0}
        records.append({"layer": layer, "head": head, **base, **shares})
    return pd.DataFrame(records)


def effects(value: float = -0.5) -> pd.Series:
    return pd.Series({h: value for h in HEADS})


def test_name_movers_pass_when_they_attend_to_io_more_than_to_both_mentions_of_s():
    cases = [
        {"L2H0": {"attn_to_IO": 0.6, "attn_to_S2": 0.3}, "L2H1": {"attn_to_IO": 0.5}, "L1H0": {"attn_to_IO": 0.4}},
        # IO 0.5 above S2 0.3 alone, but not above S1 + S2 = 0.6: fails, as the claim counts both mentions
        {
            "L2H0": {"attn_to_IO": 0.5, "attn_to_S1": 0.3, "attn_to_S2": 0.3},
            "L2H1": {"attn_to_IO": 0.5},
            "L1H0": {"attn_to_IO": 0.2},
        },
        {"L2H0": {"attn_to_S2": 0.7}, "L2H1": {"attn_to_S1": 0.2}, "L1H0": {"attn_to_IO": 0.1, "attn_to_S2": 0.2}},
    ]
    verdicts = [name_movers_claim(HEADS, effects(1.0), attention(c))[0].verdict for c in cases]
    assert verdicts == list(VERDICTS)
    claim, numbers = name_movers_claim(HEADS, effects(1.0), attention(cases[0]))
    assert (
        numbers == {"name_movers": HEADS, "name_movers_attend_io": 3} and "L2H0 (direct effect +1.00)" in claim.measured
    )


def test_s_inhibition_heads_pass_when_they_attend_from_the_end_to_s2_more_than_to_io():
    cases = [
        {h: {"attn_to_S2": 0.4, "attn_to_IO": 0.1} for h in HEADS},
        {"L2H0": {"attn_to_S2": 0.4}, "L2H1": {"attn_to_S2": 0.2, "attn_to_IO": 0.1}, "L1H0": {"attn_to_IO": 0.3}},
        {"L2H0": {"attn_to_S2": 0.4}, "L2H1": {"attn_to_IO": 0.2}, "L1H0": {"attn_to_IO": 0.3, "attn_to_S2": 0.3}},
    ]
    assert [s_inhibition_claim(HEADS, effects(), attention(c))[0].verdict for c in cases] == list(VERDICTS)


def test_induction_heads_pass_when_they_attend_from_s2_to_s1_plus_1_or_s1_more_than_to_io():
    cases = [
        {"L2H0": {"attn_to_S1+1": 0.5}, "L2H1": {"attn_to_S1": 0.4, "attn_to_IO": 0.1}, "L1H0": {"attn_to_S1": 0.3}},
        {"L2H0": {"attn_to_S1+1": 0.5}, "L2H1": {"attn_to_IO": 0.4}, "L1H0": {"attn_to_S1": 0.3}},
        {"L2H0": {"attn_to_IO": 0.5}, "L2H1": {"attn_to_IO": 0.4, "attn_to_S1": 0.3}, "L1H0": {"attn_to_S1+1": 0.3}},
    ]
    verdicts = [induction_claim(HEADS, effects(), attention(c))[0].verdict for c in cases]
    assert verdicts == list(VERDICTS)
    measured = induction_claim(HEADS, effects(), attention(cases[0]))[0].measured
    assert "(induction)" in measured and "(duplicate token)" in measured  # each head named by where it attends


def stability(mean: float, heads: list[str] = HEADS) -> dict:
    """A path_patching scan's `intervals` entry: its top heads keep `mean` of their places on average."""
    return {
        "resamples": 1000,
        "by": "damage",
        "top_n": len(heads),
        "heads": heads,
        "mean_overlap": mean,
        "min_overlap": mean / 2,
    }


@pytest.mark.parametrize("claim", [s_inhibition_claim, induction_claim])
def test_a_class_is_only_reproduced_when_its_path_ranking_is_stable(claim):
    passing = {h: {"attn_to_S2": 0.4, "attn_to_S1+1": 0.4, "attn_to_IO": 0.1} for h in HEADS}
    assert claim(HEADS, effects(), attention(passing))[0].verdict == "reproduced"
    unstable, numbers = claim(HEADS, effects(), attention(passing), stability(0.5))
    assert unstable.verdict == "partly" and "hold on average 50% of their places (lowest 25%)" in unstable.measured
    assert list(numbers.values())[-1] == 0.5 and list(numbers)[-1].endswith("_bootstrap_overlap")
    assert claim(HEADS, effects(), attention(passing), stability(0.9))[0].verdict == "reproduced"
    # an entry that ranks other heads than the class is not this class's stability: said, the verdict kept
    other = claim(HEADS, effects(), attention(passing), stability(0.5, ["L0H0", "L0H1", "L0H2"]))[0]
    assert other.verdict == "reproduced" and "(L0H0, L0H1, L0H2) are not this class" in other.measured


def test_no_candidates_of_a_class_is_not_reproduced():
    assert induction_claim([], effects(), attention({}))[0].verdict == "not reproduced"


def circuit_table(circuit: float, random: list[float]) -> pd.DataFrame:
    rows = [{"mask": "circuit: L1H0+L2H0", "kept": "L1H0 L2H0", "faithfulness": circuit}]
    rows.append({"mask": "no head kept", "kept": "", "faithfulness": 0.0})
    rows += [
        {"mask": f"random 2 (seed {i}): L0H0+L0H1", "kept": "L0H0 L0H1", "faithfulness": v}
        for i, v in enumerate(random)
    ]
    return pd.DataFrame(rows)


def test_the_circuit_is_faithful_when_it_keeps_most_of_the_behaviour_and_beats_random_circuits():
    tables = [circuit_table(0.9, [0.1, 0.3]), circuit_table(0.6, [0.1, 0.3]), circuit_table(0.2, [0.1, 0.3])]
    assert [faithfulness_claim(t)[0].verdict for t in tables] == list(VERDICTS)
    claim, numbers = faithfulness_claim(tables[0])
    assert numbers["circuit_heads"] == ["L1H0", "L2H0"] and numbers["random_faithfulness_max"] == 0.3
    assert "faithfulness 90%" in claim.measured and "10% to 30%" in claim.measured


def with_intervals(table: pd.DataFrame, circuit: tuple[float, float], random: tuple[float, float]) -> pd.DataFrame:
    """The table in logit_diff with the circuit's and every random circuit's bootstrap interval of its delta."""
    is_circuit = table["mask"].str.startswith("circuit")
    low = [circuit[0] if c else random[0] for c in is_circuit]
    high = [circuit[1] if c else random[1] for c in is_circuit]
    return table.assign(metric="logit_diff", delta_logit_diff_ci_low=low, delta_logit_diff_ci_high=high)


def test_the_circuit_beats_random_circuits_surely_only_when_its_interval_lies_above_theirs():
    apart = faithfulness_claim(with_intervals(circuit_table(0.9, [0.1, 0.3]), (-0.5, -0.2), (-2.0, -1.0)))
    assert apart[0].verdict == "reproduced" and apart[1]["circuit_interval_above_random"] is True
    assert "lies above every random circuit's" in apart[0].measured
    overlapping = faithfulness_claim(with_intervals(circuit_table(0.9, [0.1, 0.3]), (-0.5, -0.2), (-2.0, -0.3)))
    assert overlapping[0].verdict == "partly" and overlapping[1]["circuit_interval_above_random"] is False
    assert "overlaps a random circuit's" in overlapping[0].measured


def test_a_path_patching_table_ranks_its_sender_heads_by_damage_added_over_rows():
    table = pd.DataFrame(
        {
            "sender": ["emb", "L0H1", "L0H1", "L0H2", "L1.mlp", "L0H0"],
            "damage": [9.0, 0.2, 0.3, 0.4, 5.0, -1.0],
        }
    )
    assert top_sender_heads(table, 2) == ["L0H1", "L0H2"]  # 0.5 over two rows beats 0.4; emb and MLPs are no heads
    assert top_sender_heads(table, 5) == ["L0H1", "L0H2", "L0H0"]


# --- the head circuit is the edge circuit without the ablated heads' out-edges -----------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_keeping_heads_equals_removing_every_other_heads_out_edges(dtype):
    """A head mask (kept heads' gates 1, the others' z replaced by the corrupted run's) gives the metric of the
    edge-patched forward with every out-edge of the other heads removed: what head_circuit's faithfulness rests on."""
    torch.manual_seed(0)
    cfg = ModelConfig(
        n_layers=3, d_model=32, n_ctx=16, vocab_size=50, attn=AttentionConfig(n_heads=4, n_kv_heads=2),
        positions="rotary", norm="rmsnorm", mlp=True, mlp_act="swiglu",
    )  # fmt: skip
    model = Transformer(cfg).to(dtype).eval()
    ids, corrupted = torch.randint(0, 50, (5, 9)), torch.randint(0, 50, (5, 9))
    metric = lambda logits_BV: logits_BV[:, 3] - logits_BV[:, 7]  # noqa: E731
    kept = {(0, 1), (1, 3), (2, 0)}
    graph = Graph.of(model)
    removed = [
        i for i, e in enumerate(graph.edges) if e.sender.kind == "head" and (e.sender.layer, e.sender.head) not in kept
    ]
    weights = torch.zeros(2, len(graph.edges), dtype=torch.float64)
    weights[1, removed] = 1.0
    clean_sum, edges_sum = edge_metric(model, ids, corrupted, weights, metric).tolist()
    gates = torch.zeros(3, 4, dtype=dtype)
    for layer, head in kept:
        gates[layer, head] = 1.0
    with torch.no_grad():
        replacements = node_outputs(model, corrupted).z
        masked = model(ids, gated(gates, replacements))[:, -1]
        plain = model(ids)[:, -1]
    tolerance = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1e-10, "atol": 1e-10}
    torch.testing.assert_close(torch.tensor(edges_sum, dtype=torch.float64), metric(masked).double().sum(), **tolerance)
    torch.testing.assert_close(torch.tensor(clean_sum, dtype=torch.float64), metric(plain).double().sum(), **tolerance)
    assert abs(edges_sum - clean_sum) > 1e-3  # the removed edges matter: the comparison can fail


# --- the experiment at smoke size ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("ioi_circuit")
    mp = pytest.MonkeyPatch()
    try:
        args = ["experiment=ioi_circuit", "size=smoke", "ablation.progress=false", "hydra.run.dir=run"]
        assert train_in_process(mp, root, args) == 0
    finally:
        mp.undo()
    return root / "run"


def task_table(run_dir: Path, name: str, tagged: bool = True) -> pd.DataFrame:
    folder = RunPaths(run_dir).ablation / "tasks" / "ioi"
    return pd.read_csv(folder / (f"{name}.patch.logit_diff.csv" if tagged else f"{name}.csv"))


def test_the_experiment_at_smoke_size_evaluates_every_claim(smoke_run):
    findings = json.loads((smoke_run / "findings" / "findings.json").read_text())
    assert len(findings["claims"]) == 5 and all(c["verdict"] in VERDICTS for c in findings["claims"])
    assert all(c["measured"] for c in findings["claims"]) and findings["numbers"]["circuit_heads"]
    assert all((smoke_run / "findings" / figure).exists() for figure in findings["figures"])
    again = json.loads(check_finding("ioi_circuit", smoke_run).with_suffix(".json").read_text())
    assert again["claims"] == findings["claims"]  # read back from the tables alone


def test_seed_stability_on_the_generated_ioi_task(smoke_run):
    """Run.seed_stability on a real generated task (ioi at smoke size, a tiny random Llama): each seed's task is the
    generator's own (its own prompts: fingerprints differ), each seed's top heads are its table's top by damage, and
    each overlap is |top_a & top_b| / n of those tops, counted here from the tables read back."""
    import headcount
    from headcount.api_stability import top_heads

    run = headcount.load_run(smoke_run)
    pairs, summary = run.seed_stability("single_head", [1, 2, 3], n=2)
    folder = RunPaths(smoke_run).ablation / "tasks"
    tables = {s: pd.read_csv(folder / f"ioi_seed{s}" / "single_head.patch.logit_diff.csv") for s in (1, 2, 3)}
    assert len({t["task_fingerprint"].iloc[0] for t in tables.values()}) == 3  # three different prompt sets
    assert summary["tops"] == {s: top_heads(t, 2) for s, t in tables.items()} and summary["n"] == 2
    # damage in logit difference is its fall: each seed's first head is the one whose patching lowers it most
    assert all(summary["tops"][s][0] == t.loc[t["delta_logit_diff"].idxmin(), "mask"] for s, t in tables.items())
    for row in pairs.itertuples():
        shared = set(summary["tops"][row.seed_a]) & set(summary["tops"][row.seed_b])
        assert row.overlap == len(shared) / 2
    assert summary["mean_overlap"] == pytest.approx(pairs["overlap"].mean()) and 0 <= summary["min_overlap"] <= 1


def test_task_seeds_from_the_command_line_write_the_tables_seed_stability_gives(smoke_run, tmp_path, monkeypatch):
    """headcount-ablate ablation.task_seeds=[1,2,3]: each mask scan run on each seed's task and its tops compared,
    written beside the scan's table; the table is Run.seed_stability's (computed there in another copy of the run)."""
    import shutil

    import headcount

    run = shutil.copytree(smoke_run, tmp_path / "run")
    for seeded in (RunPaths(run).ablation / "tasks").glob("ioi_seed*"):
        shutil.rmtree(seeded)  # computed here, not read back from another test's
    args = [f"run_dir={run}", "ablation=[single_head]", "ablation.task_seeds=[1,2,3]", "ablation.progress=false"]
    assert command_in_process(ablating.main, monkeypatch, tmp_path, args) == 0
    folder = RunPaths(run).ablation / "tasks"
    written = pd.read_csv(folder / "ioi" / "single_head_seed_stability.patch.logit_diff.csv")
    assert (folder / "ioi" / "single_head_seed_stability.patch.logit_diff.png").stat().st_size > 1000
    assert all((folder / f"ioi_seed{s}" / "single_head.patch.logit_diff.csv").exists() for s in (1, 2, 3))
    pairs, summary = headcount.load_run(shutil.copytree(smoke_run, tmp_path / "api")).seed_stability(
        "single_head", [1, 2, 3]
    )
    pd.testing.assert_frame_equal(written, pairs)
    recorded = json.loads((folder / "ioi" / "summary.json").read_text())
    section = next(s for s in recorded["modes"].values() if "seed_stability" in s)
    assert section["seed_stability"]["single_head"]["mean_overlap"] == summary["mean_overlap"]
    assert section["seed_stability"]["single_head"]["tops"] == {str(k): v for k, v in summary["tops"].items()}


def test_task_seeds_compare_an_edge_circuits_top_edges_across_seeds(smoke_run, tmp_path, monkeypatch):
    """ablation.task_seeds with edge_attribution: each seed's table ranks its edges by |circuit_by| and the top
    circuit_size of every two seeds are compared, written beside the base task's table; Run.seed_stability gives the
    same, its n the scan's circuit_size by default."""
    import shutil

    import headcount
    from headcount.api_stability import top_edges

    run = shutil.copytree(smoke_run, tmp_path / "run")
    for seeded in (RunPaths(run).ablation / "tasks").glob("ioi_seed*"):
        shutil.rmtree(seeded)
    scan = ["ablation=[edge_attribution]", "ablation.scans.edge_attribution.circuit_size=6"]
    scan += ["ablation.scans.edge_attribution.random_sets=1", "ablation.scans.edge_attribution.circuit_sizes=[1]"]
    args = [f"run_dir={run}", *scan, "ablation.task_seeds=[1,2]", "ablation.progress=false"]
    assert command_in_process(ablating.main, monkeypatch, tmp_path, args) == 0
    folder = RunPaths(run).ablation / "tasks"
    written = pd.read_csv(folder / "ioi" / "edge_attribution_seed_stability.patch.logit_diff.csv")
    assert (folder / "ioi" / "edge_attribution_seed_stability.patch.logit_diff.png").stat().st_size > 1000
    tables = {s: pd.read_csv(folder / f"ioi_seed{s}" / "edge_attribution.patch.logit_diff.csv") for s in (1, 2)}
    tops = {s: top_edges(t, 6) for s, t in tables.items()}
    assert all(t["circuit_by"].eq("eap_ig").all() for t in tables.values())
    assert tops[1][0] == tables[1].loc[tables[1]["eap_ig"].abs().idxmax(), "edge"] and tops[1] != tops[2]
    assert written["overlap"].tolist() == [len(set(tops[1]) & set(tops[2])) / 6]
    recorded = json.loads((folder / "ioi" / "summary.json").read_text())
    entry = next(s for s in recorded["modes"].values() if "seed_stability" in s)["seed_stability"]["edge_attribution"]
    assert entry["n"] == 6 and entry["by"] == "|eap_ig|" and entry["tops"] == {"1": tops[1], "2": tops[2]}
    settings = {"circuit_size": 6, "random_sets": 1, "circuit_sizes": [1]}  # read back: the seeds' tables
    pairs, summary = headcount.load_run(run).seed_stability("edge_attribution", [1, 2], **settings)
    pd.testing.assert_frame_equal(written, pairs)
    assert summary["n"] == 6 and summary["tops"] == tops


def test_each_scan_reads_the_heads_the_one_before_found(smoke_run):
    direct = task_table(smoke_run, "direct_effect")
    name_movers = [f"L{r.layer}H{r.head}" for r in direct.nlargest(3, "direct_effect").itertuples()]
    s_inhibition = task_table(smoke_run, "s_inhibition")
    layer = lambda name: int(name[1:].split("H")[0])  # noqa: E731
    every_reaching = [f"L{l}H{h}" for l in range(3) for h in range(4) if any(layer(n) > l for n in name_movers)]
    assert s_inhibition["sender"].tolist() == every_reaching  # senders [heads], those no name mover reads skipped
    for row in s_inhibition.itertuples():
        expected = [f"{n}.q" for n in name_movers if layer(n) > layer(row.sender)]
        assert row.receivers.split(", ") == expected
    induction = task_table(smoke_run, "induction")
    chosen = top_sender_heads(s_inhibition, 3)
    receivers = {r for rs in induction["receivers"] for r in rs.split(", ")}
    assert receivers == {f"{h}.v" for h in chosen if layer(h) > 0}
    intervals = json.loads((RunPaths(smoke_run).ablation / "tasks" / "ioi" / "summary.json").read_text())["modes"][
        "patch.logit_diff"
    ]["intervals"]
    findings = json.loads((smoke_run / "findings" / "findings.json").read_text())["numbers"]
    for scan, table in (("s_inhibition", s_inhibition), ("induction", induction)):
        entry = intervals[scan]  # the class's ranking: the top 3 the next scan takes, their stability over resamples
        assert entry["top_n"] == 3 and entry["heads"] == top_sender_heads(table, 3) and entry["resamples"] == 1000
        assert 0 <= entry["min_overlap"] <= entry["mean_overlap"] <= 1
        assert findings[f"{scan}_bootstrap_overlap"] == entry["mean_overlap"]
    circuit = task_table(smoke_run, "circuit")
    kept = set(circuit.loc[circuit["mask"].str.startswith("circuit: "), "kept"].iloc[0].split())
    assert kept == {*name_movers, *chosen, *top_sender_heads(induction, 3)}
    assert circuit.loc[circuit["mask"] == "no head kept", "faithfulness"].iloc[0] == 0.0
    assert (circuit["mask"].str.startswith("random ")).sum() == 5


def test_attention_from_s2_is_read_at_each_prompts_s2(smoke_run):
    from omegaconf import OmegaConf

    from headcount.ablation.session import AblationSession

    config = OmegaConf.load(RunPaths(smoke_run).config)
    config.ablation.scans = {}
    session = AblationSession(config, smoke_run)
    table = task_table(smoke_run, "attention_from_s2", tagged=False)
    positions = session.positions
    sums, n, per_prompt = torch.zeros(4, 3, 4, dtype=torch.float64), 0, []
    for batch in session.batches:
        cache = reads(["attn.pattern"], range(session.model.n_layers))
        with torch.no_grad():
            session.model(batch["input_ids"], cache)
        for b in range(batch["input_ids"].shape[0]):
            s2 = int(batch["named_pos"][b, positions.index("S2")])
            prompt = torch.zeros(4, 3, 4, dtype=torch.float64)
            for k, name in enumerate(["IO", "S1", "S1+1", "S2"]):
                to = int(batch["named_pos"][b, positions.index(name)])
                for layer in range(3):
                    prompt[k, layer] = cache.read("attn.pattern", layer)[b, :, s2, to].double()
            sums += prompt
            per_prompt.append(prompt)
            n += 1
    layers, heads = table["layer"].tolist(), table["head"].tolist()
    for k, name in enumerate(["IO", "S1", "S1+1", "S2"]):
        expected = (sums[k] / n)[layers, heads]
        torch.testing.assert_close(torch.tensor(table[f"attn_to_{name}"].to_numpy()), expected, rtol=1e-5, atol=1e-7)
        # its interval: these prompts' own values resampled (a value credited to another prompt would move it)
        values = torch.stack(per_prompt)[:, k][:, layers, heads]
        bounds, _ = score_intervals(values, torch.ones(n, dtype=torch.float64), f"attn_to_{name}", 0)
        for end in ("ci_low", "ci_high"):
            got = table[f"attn_to_{name}_{end}"].to_numpy()
            assert got == pytest.approx(bounds[f"attn_to_{name}_{end}"], rel=1e-5, abs=1e-7)


BAD = [
    (
        ["ablation=position_attention", "ablation.scans.position_attention.from_position=S3"],
        "from_position='S3': is not a named position",
    ),
    (
        ["ablation=path_patching", "ablation.scans.path_patching.receivers=[top3:nothing.v]"],
        "receivers='top3:nothing.v': nothing ranks no heads",
    ),
    (["ablation=path_patching", "ablation.scans.path_patching.senders=[top3:path_patching]"], "names this scan itself"),
    (["ablation=head_circuit", "ablation.scans.head_circuit.heads=[]"], "head_circuit.heads=[]: names none"),
    (["ablation=single_head", "ablation.task_seeds=[1,1]"], "ablation.task_seeds=[1, 1]: a list of at least two"),
    (["ablation=single_head", "ablation.task_seeds=3"], "ablation.task_seeds=3: a list of at least two different"),
    (["ablation=head_circuit", "ablation.scans.head_circuit.heads=[L0.mlp]"], "heads='L0.mlp': is not a head"),
    (
        [
            "ablation=path_patching",
            "ablation.scans.path_patching.senders=[L2H0]",
            "ablation.scans.path_patching.receivers=[L1H0.q]",
            "ablation.scans.path_patching.skip_unreached=true",
        ],
        "read none of the senders L2H0",
    ),
]


@pytest.mark.parametrize("args, message", BAD, ids=[b[1].split(":")[0] for b in BAD])
def test_bad_input_is_one_line_and_leaves_nothing(smoke_run, monkeypatch, capsys, args, message):
    ablation = RunPaths(smoke_run).ablation
    before = sorted((p, p.stat().st_mtime_ns) for p in ablation.rglob("*") if "logs" not in p.parts)
    code = command_in_process(ablating.main, monkeypatch, smoke_run.parent, [f"run_dir={smoke_run}", *args])
    assert code == 2
    assert message in one_line(capsys.readouterr().err)
    assert sorted((p, p.stat().st_mtime_ns) for p in ablation.rglob("*") if "logs" not in p.parts) == before


def test_bench_edges_runs_on_a_tiny_model():
    """scripts/bench_edges.py (docs/BENCHMARKS.md's edge figures) still runs against the code it measures."""
    import subprocess
    import sys

    scripts = Path(__file__).resolve().parents[1] / "scripts"
    command = [
        sys.executable,
        "bench_edges.py",
        "--model",
        "tiny",
        "--prompts",
        "6",
        "--candidates",
        "10",
        "--random",
        "5",
    ]
    proc = subprocess.run(command, cwd=scripts, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for line in (
        "EAP, every edge",
        "EAP-IG (5 steps), every edge",
        "exact path patching of",
        "recall of the exact top",
    ):
        assert line in proc.stdout, proc.stdout
