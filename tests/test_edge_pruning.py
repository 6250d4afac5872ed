"""Edge pruning (ablation/methods/edge_pruning.py) and the ensemble ranking (circuits/ensemble.py): the learned masks
recover a circuit planted by hand in a model whose other edges carry nothing, its faithfulness measured exactly; the
same seed gives the same mask; the ensemble equals rank normalisation by hand (a z-score or a signed rank fails);
bad settings are one line; the edge_attribution scan's edge_pruning and ensemble rows are the core's on its prompts,
CPR and CMD included."""

import json
from pathlib import Path

import pandas as pd
import pytest
import torch
from sweep_helpers import ablate_unchanged, one_line, smoke_run

import headcount
from headcount.ablation.methods import edge_pruning as pruning_module
from headcount.ablation.methods.edge_pruning import edge_pruning
from headcount.ablation.scans.base import typed_scan
from headcount.circuits import Graph, faithfulness
from headcount.circuits import ensemble as ensemble_module
from headcount.circuits.cpr import circuit_performance
from headcount.circuits.ensemble import ensemble_scores, rank_normalise
from headcount.config.model import AttentionConfig, ModelConfig
from headcount.config.scans import EdgePruningSettings, check_edge_methods, check_edge_pruning
from headcount.errors import ConfigError
from headcount.model.transformer import Transformer
from headcount.run_dir import RunPaths

PLANTED = ["emb -> L0H0.v", "L0H0 -> L1H1.v", "L1H1 -> logits"]


def planted_model(dtype: torch.dtype) -> Transformer:
    """A 2-layer attention-only model without norms whose only signal path is PLANTED: tokens one-hot in dims 0..3,
    L0H0 copies them (its value) into dims 4..7, L1H1 copies those into dims 8..11, the logits read dims 8..11 alone;
    queries and keys are zero (uniform causal attention), every other head writes nothing (W_O = 0). Every other
    edge's removal changes nothing, whatever else is removed: the circuit is known by construction."""
    attn = AttentionConfig(n_heads=3, qkv_bias=False, out_bias=False)
    cfg = ModelConfig(
        d_model=12, n_ctx=8, vocab_size=4, n_layers=2, positions="rotary", pre_norm=False, final_norm=False, attn=attn
    )
    model = Transformer(cfg).to(dtype).eval()
    eye = torch.eye(4, dtype=dtype)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.tok_emb.weight[:, 0:4] = eye
        first, second = model.blocks[0].attn, model.blocks[1].attn
        first.W_V[0][0:4, :] = eye  # a view of the fused qkv weight
        first.out.weight[4:8, 0:4] = eye  # out.weight (C, H*D): head 0's columns 0..3
        second.W_V[1][4:8, :] = eye
        second.out.weight[8:12, 4:8] = eye  # head 1's columns 4..7
        model.lm_head.weight[:, 8:12] = eye
    return model


def planted_prompts() -> tuple[torch.Tensor, torch.Tensor]:
    """Clean prompts open with three 0s, their corrupted counterparts with three 1s; the rest is shared."""
    clean = torch.randint(0, 4, (12, 6), generator=torch.Generator().manual_seed(0))
    clean[:, :3] = 0
    corrupted = clean.clone()
    corrupted[:, :3] = 1
    return clean, corrupted


def logit_diff(logits_PV: torch.Tensor) -> torch.Tensor:
    return logits_PV[:, 0] - logits_PV[:, 1]


def names(graph: Graph, edges: torch.Tensor) -> set[str]:
    return {graph.edges[i].name for i in edges.tolist()}


def test_the_planted_model_has_exactly_the_planted_circuit():
    """The construction is what the tests below rely on: the planted edges keep the whole gap (faithfulness 1),
    and without any one of them nothing is kept (0)."""
    model, (clean, corrupted) = planted_model(torch.float64), planted_prompts()
    planted = set(Graph.of(model).edges_named(PLANTED))
    circuits = [planted] + [planted - {e} for e in planted]
    values = faithfulness(model, clean, corrupted, circuits, logit_diff)
    torch.testing.assert_close(values, torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=torch.float64), rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("objective", ["kl", "metric"])
def test_edge_pruning_recovers_the_planted_circuit(dtype, objective):
    model, (clean, corrupted) = planted_model(dtype), planted_prompts()
    graph = Graph.of(model)
    cfg = EdgePruningSettings(steps=100, target_sparsity=1 - 3 / len(graph.edges), objective=objective)
    result = edge_pruning(model, clean, corrupted, logit_diff, cfg)
    assert names(graph, result.kept.nonzero()[:, 0]) == set(PLANTED)
    assert names(graph, result.scores.argsort(descending=True)[:3]) == set(PLANTED)
    assert (result.scores >= 0).all() and result.scores.min() == 0  # log_alpha above the lowest: |score| ranks
    assert abs(result.history[-1]["density"] - 3 / len(graph.edges)) < 0.03  # steered to the target sparsity
    # the learned circuit's faithfulness, measured exactly by the edge-patched forward
    learned = set(result.kept.nonzero()[:, 0].tolist())
    value = faithfulness(model, clean, corrupted, [learned], logit_diff)
    tolerance = 1e-12 if dtype == torch.float64 else 1e-5
    assert abs(float(value[0]) - 1.0) < tolerance
    assert all(p.requires_grad for p in model.parameters())  # the model's flags are given back


def test_the_kl_objective_is_kl_divergence_from_the_full_model():
    full, circuit = torch.randn(5, 7, dtype=torch.float64), torch.randn(5, 7, dtype=torch.float64)
    full_logprobs = full.log_softmax(-1)
    by_torch = torch.nn.functional.kl_div(
        circuit.log_softmax(-1), full_logprobs, reduction="batchmean", log_target=True
    )
    torch.testing.assert_close(pruning_module.kl_from_full(full_logprobs, circuit), by_torch, rtol=1e-12, atol=0)
    assert float(pruning_module.kl_from_full(full_logprobs, full)) == pytest.approx(0.0, abs=1e-15)


def test_the_same_seed_gives_the_same_mask_and_another_seed_another():
    model, (clean, corrupted) = planted_model(torch.float64), planted_prompts()
    run = lambda seed: edge_pruning(  # noqa: E731
        model, clean, corrupted, logit_diff, EdgePruningSettings(steps=15, seed=seed)
    )
    first, again, other = run(0), run(0), run(1)
    assert torch.equal(first.log_alpha, again.log_alpha) and torch.equal(first.kept, again.kept)
    assert first.history == again.history
    assert not torch.equal(first.log_alpha, other.log_alpha)


def test_batches_of_examples_train_on_every_example_in_turn():
    """batch_size 5 of 12 examples: batches of 5, 5 and 2 cycled in order (each step's examples are its batch's)."""
    model, (clean, corrupted) = planted_model(torch.float64), planted_prompts()
    result = edge_pruning(model, clean, corrupted, logit_diff, EdgePruningSettings(steps=4, batch_size=5))
    assert result.examples_per_step == 5 and len(result.history) == 4


def test_warm_start_starts_from_eap_ig_ranks():
    """With a step too small to move it, log_alpha is the warm start: init + scale (2 rank/E - 1)."""
    model, (clean, corrupted) = planted_model(torch.float64), planted_prompts()
    n = len(Graph.of(model).edges)
    warm = torch.linspace(-2.0, 3.0, n, dtype=torch.float64)  # |warm|: ranks by hand below
    cfg = EdgePruningSettings(steps=1, lr=1e-12, warm_start=True, warm_scale=2.0, log_alpha_init=1.0)
    result = edge_pruning(model, clean, corrupted, logit_diff, cfg, warm_start_scores=warm)
    ranks = warm.abs().argsort().argsort().double() + 1  # no ties among these |warm|
    torch.testing.assert_close(result.log_alpha, 1.0 + 2.0 * (2 * ranks / n - 1), rtol=0, atol=1e-9)
    with pytest.raises(ValueError, match="warm_start needs"):
        edge_pruning(model, clean, corrupted, logit_diff, cfg)


def test_rank_normalise_and_the_ensemble_by_hand():
    """|score| ranked, ties averaged, over the number of edges; the ensemble the mean of the methods' ranks."""
    eap = torch.tensor([0.5, -4.0, 0.5, 100.0], dtype=torch.float64)  # |.|: 0.5, 4, 0.5, 100: ranks 1.5, 3, 1.5, 4
    eap_ig = torch.tensor([-3.0, 2.0, 1.0, 0.1], dtype=torch.float64)  # |.|: ranks 4, 3, 2, 1
    pruning = torch.tensor([7.0, 0.0, 9.0, 8.0], dtype=torch.float64)  # ranks 2, 1, 4, 3
    torch.testing.assert_close(rank_normalise(eap), torch.tensor([1.5, 3, 1.5, 4], dtype=torch.float64) / 4)
    ranks = [[1.5, 3, 1.5, 4], [4, 3, 2, 1], [2, 1, 4, 3]]
    expected = torch.tensor(ranks, dtype=torch.float64).sum(0) / 12
    got = ensemble_scores({"eap": eap, "eap_ig": eap_ig, "edge_pruning": pruning})
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-15)
    # edge 3: (4 + 1 + 3) / 12 first; edges 0 and 2 tie at 7.5 / 12
    assert int(got.argmax()) == 3 and got[0] == got[2]


@pytest.mark.parametrize(
    "plant",
    [
        lambda s: (s.double() - s.double().mean()) / s.double().std(),  # z-score
        lambda s: (s.double().abs() - s.double().abs().mean()) / s.double().abs().std(),  # z-score of |score|
        lambda s: torch.tensor(pd.Series(s.double().numpy()).rank().to_numpy()) / len(s),  # signed rank
        lambda s: torch.tensor(pd.Series(s.double().abs().numpy()).rank(method="first").to_numpy()) / len(s),  # ties
    ],
    ids=["z_score", "z_score_of_abs", "signed_rank", "ties_not_averaged"],
)
def test_a_planted_wrong_normalisation_fails_the_hand_computation(plant, monkeypatch):
    monkeypatch.setattr(ensemble_module, "rank_normalise", plant)
    with pytest.raises(AssertionError):
        test_rank_normalise_and_the_ensemble_by_hand()


BAD_SETTINGS = [
    ("steps", 0, "ep.steps=0: must be a positive integer"),
    ("lr", float("inf"), "ep.lr=inf: must be a finite number above 0"),
    ("target_sparsity", 1.0, "ep.target_sparsity=1.0: must be in [0, 1)"),
    ("target_warmup", 1.5, "ep.target_warmup=1.5: must be in [0, 1]"),
    ("objective", "mse", "ep.objective='mse': must be one of kl, metric"),
    ("gamma", 0.1, "ep.gamma=0.1: must be a finite negative number"),
    ("zeta", 1.0, "ep.zeta=1.0: must be a finite number above 1"),
    ("batch_size", 0, "ep.batch_size=0: must be a positive integer or null"),
    ("seed", -1, "ep.seed=-1: must be an integer in 0.."),
]


@pytest.mark.parametrize("key, value, message", BAD_SETTINGS, ids=[b[0] for b in BAD_SETTINGS])
def test_invalid_settings_are_one_line(key, value, message):
    with pytest.raises(ConfigError) as error:
        check_edge_pruning(EdgePruningSettings(**{key: value}), "ep")
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


def test_unknown_settings_and_methods_are_one_line():
    with pytest.raises(ConfigError) as error:
        typed_scan("edges", {"kind": "edge_attribution", "edge_pruning": {"stepz": 3}})
    assert str(error.value).startswith("ablation.scans.edges.edge_pruning.stepz=3:")
    assert "steps" in str(error.value) and "\n" not in str(error.value)
    with pytest.raises(
        ConfigError, match=r"^m='lasso': methods beyond eap, eap_ig and exact .* edge_pruning, ensemble"
    ):
        check_edge_methods(["lasso"], "m")
    with pytest.raises(ConfigError, match=r"ensemble averages eap, eap_ig and edge_pruning: add edge_pruning$"):
        check_edge_methods(["ensemble"], "m")
    with pytest.raises(ConfigError, match="lists a method twice"):
        check_edge_methods(["edge_pruning", "edge_pruning"], "m")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return smoke_run(pytest.MonkeyPatch, tmp_path_factory.mktemp("edge_pruning"))


SCAN = dict(
    mode="zero",
    steps=2,
    verify_top_k=0,
    circuit_size=6,
    random_sets=1,
    methods=["edge_pruning", "ensemble"],
    edge_pruning={"steps": 30, "target_sparsity": 0.8, "warm_start": True},
)


def test_the_scan_scores_edge_pruning_and_the_ensemble_as_the_core_does(run_dir, monkeypatch):
    """The scan's edge_pruning column is the core's training on the scan's prompts (warm-started from its EAP-IG),
    the ensemble the mean of ranks of its columns, their curves at MIB's sizes, CPR and CMD those of
    circuit_performance on the same scores, the learned circuit's faithfulness measured exactly."""
    trained = []
    train = pruning_module.edge_pruning

    def spied(model, clean, corrupted, metric, *args, **kwargs):
        result = train(model, clean, corrupted, metric, *args, **kwargs)
        trained.append((model, clean, corrupted, metric, args[1], result))
        return result

    monkeypatch.setattr("headcount.ablation.scans.edge_attribution.edge_pruning", spied)
    run = headcount.load_run(run_dir)
    table = run.scan("edge_attribution", **SCAN)
    ((model, clean, corrupted, metric, points, result),) = trained
    graph = Graph.of(model)
    assert table["edge"].tolist() == [e.name for e in graph.edges]
    torch.testing.assert_close(torch.tensor(table["edge_pruning"].to_numpy()), result.scores, rtol=0, atol=0)
    assert table["edge_pruning_kept"].tolist() == result.kept.tolist()
    n = len(table)
    by_hand = {m: torch.tensor(table[m].to_numpy()) for m in ("eap", "eap_ig", "edge_pruning")}
    torch.testing.assert_close(torch.tensor(table["ensemble"].to_numpy()), ensemble_scores(by_hand))
    ablation = RunPaths(run_dir).ablation
    areas = pd.read_csv(ablation / "edge_attribution_cpr.csv").set_index("method")
    scores = {"edge_pruning": result.scores, "ensemble": ensemble_scores({**by_hand, "edge_pruning": result.scores})}
    _, core = circuit_performance(model, clean, corrupted, scores, metric, points)
    for method in ("edge_pruning", "ensemble"):
        row = core[core["method"] == method].iloc[0]
        assert float(areas.loc[method, "cpr"]) == pytest.approx(float(row["cpr"]), abs=1e-9)
        assert float(areas.loc[method, "cmd"]) == pytest.approx(float(row["cmd"]), abs=1e-9)
    curve = pd.read_csv(ablation / "edge_attribution_faithfulness.csv")
    assert {"edge_pruning", "ensemble"} <= set(curve["method"]) and n in set(curve["n"])
    summary = json.loads((ablation / "summary.json").read_text())["modes"]["zero"]["edge_circuits"]
    learned = summary["edge_attribution"]["edge_pruning"]
    kept = set(result.kept.nonzero()[:, 0].tolist())
    assert learned["kept_edges"] == len(kept) and learned["steps"] == 30
    exact = float(faithfulness(model, clean, corrupted, [kept], metric, points)[0])
    assert learned["faithfulness"] == pytest.approx(exact, abs=1e-9)
    assert set(summary["edge_attribution"]["mib"]) >= {"edge_pruning", "ensemble"}


BAD = [
    (
        ["ablation=edge_attribution", "ablation.scans.edge_attribution.methods=[ensemble]"],
        "edge_attribution.methods=['ensemble']: ensemble averages eap, eap_ig and edge_pruning: add edge_pruning",
    ),
    (
        [
            "ablation=edge_attribution",
            "ablation.scans.edge_attribution.methods=[edge_pruning]",
            "ablation.scans.edge_attribution.edge_pruning.target_sparsity=1.5",
        ],
        "edge_attribution.edge_pruning.target_sparsity=1.5: must be in [0, 1)",
    ),
    (
        ["ablation=edge_attribution", "+ablation.scans.edge_attribution.edge_pruning.stepz=3"],
        "edge_attribution.edge_pruning.stepz",
    ),
]


@pytest.mark.parametrize("args, message", BAD, ids=["ensemble_alone", "sparsity", "unknown_key"])
def test_bad_input_on_the_command_line_is_one_line_and_leaves_nothing(run_dir, monkeypatch, capsys, args, message):
    assert ablate_unchanged(run_dir, monkeypatch, ["ablation.progress=false", *args]) == (2, True)
    assert message in one_line(capsys.readouterr().err)


@pytest.mark.parametrize("kind, section", [("edge_attribution", "edge_pruning"), ("l0_gates", "l0")])
def test_a_key_added_to_a_typed_nested_section_is_refused(kind, section):
    """What `+ablation.scans.<name>.<section>.stepz=3` makes: settings typed when composed, holding an attribute
    the nested section lacks; it was ignored before."""
    from headcount.config.scans import SETTINGS

    settings = SETTINGS[kind](kind=kind)
    getattr(settings, section).stepz = 3
    with pytest.raises(ConfigError) as error:
        typed_scan("s", settings)
    assert str(error.value).startswith(f"ablation.scans.s.{section}.stepz=3: not a key of ablation.scans.s.{section}")
    assert str(error.value).endswith(f"did you mean ablation.scans.s.{section}.steps?")
