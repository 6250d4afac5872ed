"""Pruning curves on a toy loss whose answer is known by hand, one real-model run, and the prunable-fraction rule."""

import logging

import pandas as pd
import pytest
import torch

from headcount.ablation.methods.importance import gradient_importance
from headcount.ablation.methods.pruning import CURVE_COLUMNS, prunable_fractions, pruning_curves
from headcount.config.ablation import PruningConfig
from headcount.errors import ConfigError
from headcount.metrics import token_nll_and_correct
from headcount.model import AttentionConfig, ModelConfig, Transformer
from headcount.model.intervention import gated

BASE_LOSS = 2.0
# Toy model: 2 layers, layer 1 pruned to 2 of 3 heads. Removing a head adds its cost to the loss.
HEADS_PER_LAYER = [3, 2]
COST_LH = torch.tensor([[0.1, 0.4, 0.2], [0.3, 0.5, 99.0]])  # [1, 2] does not exist: it must never count


class ToyEvaluator:
    """Records every mask it is asked about; loss = BASE_LOSS + cost of the removed heads."""

    def __init__(self):
        self.masks: list[torch.Tensor] = []

    def __call__(self, masks_MLH: torch.Tensor) -> dict:
        self.masks.extend(masks_MLH)
        loss_M = BASE_LOSS + ((1 - masks_MLH) * COST_LH).sum(dim=(1, 2))
        return {"loss": loss_M, "acc": 1 / loss_M}


class CountingImportance:
    """Importance = cost + heads already removed from the same layer (its survivors carry more): a ranking that
    changes with the mask, so iterative pruning can disagree with one-shot pruning."""

    def __init__(self):
        self.calls = 0

    def __call__(self, mask_LH: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        removed_L1 = (1 - mask_LH).sum(dim=1, keepdim=True)
        return (COST_LH + removed_L1) * mask_LH


def curves_for(orders, step=0.2, seed=0, random_seeds=2, single_head_delta=COST_LH, evaluate=None, importance=None):
    cfg = PruningConfig(step=step, orders=list(orders), random_seeds=random_seeds)
    return pruning_curves(
        evaluate or ToyEvaluator(),
        importance or CountingImportance(),
        single_head_delta,
        HEADS_PER_LAYER,
        cfg,
        seed,
        {"loss": BASE_LOSS, "acc": 0.5},
    )


def cheapest_first_loss(n_pruned: int) -> float:
    costs = sorted(COST_LH[0, :3].tolist() + COST_LH[1, :2].tolist())
    return BASE_LOSS + sum(costs[:n_pruned])


def test_columns_fractions_and_counts():
    evaluator = ToyEvaluator()
    curves = curves_for(["gradient", "gradient_iterative", "single_head", "random"], step=0.3, evaluate=evaluator)
    assert list(curves.columns) == CURVE_COLUMNS
    per_curve = curves.groupby(["order", "seed"], sort=False)
    assert [key for key, _ in per_curve] == [("gradient", 0), ("gradient_iterative", 0), ("single_head", 0)] + [
        ("random", s) for s in (0, 1)
    ]
    for _, curve in per_curve:
        assert curve["fraction"].tolist() == [0.0, 0.3, 0.6, 0.9, 1.0]
        assert curve["n_pruned"].tolist() == [0, 2, 3, 4, 5]  # round(f * 5): the missing head never counts
    for mask_LH in evaluator.masks:
        assert mask_LH[1, 2] == 1  # a head the pruned layer lacks is never removed
    assert len(evaluator.masks) == len({tuple(m.flatten().tolist()) for m in evaluator.masks})  # each mask once


def test_fraction_zero_is_baseline_and_one_removes_every_head():
    curves = curves_for(["gradient", "gradient_iterative", "single_head", "random"])
    start, end = curves[curves["fraction"] == 0], curves[curves["fraction"] == 1.0]
    assert (start["loss"] == BASE_LOSS).all() and (start["delta_loss"] == 0).all() and (start["n_pruned"] == 0).all()
    assert (end["n_pruned"] == 5).all()
    assert end["loss"].tolist() == pytest.approx([cheapest_first_loss(5)] * len(end))
    assert (curves["delta_loss"] == curves["loss"] - BASE_LOSS).all()


@pytest.mark.parametrize("order", ["gradient", "single_head"])
def test_ranked_orders_remove_least_important_first(order):
    # Importance at all ones and the single-head deltas both equal the cost, so the cheapest heads go first.
    curve = curves_for([order], step=0.2)
    expected = [cheapest_first_loss(n) for n in curve["n_pruned"]]
    assert curve["loss"].tolist() == pytest.approx(expected)


def test_iterative_recomputes_importance_each_step_and_differs_from_one_shot():
    one_shot_importance, iterative_importance = CountingImportance(), CountingImportance()
    one_shot = curves_for(["gradient"], step=0.2, importance=one_shot_importance)
    iterative = curves_for(["gradient_iterative"], step=0.2, importance=iterative_importance)
    assert one_shot_importance.calls == 1
    assert iterative_importance.calls == 4  # before removing heads 1, 2, 3 and 4; the last needs no ranking
    # One-shot removes 0.1, 0.2, 0.3, 0.4 in that order. Iteratively, once 0.1 is gone its layer's survivors gain 1,
    # so the second step removes 0.3 from the other layer instead of 0.2.
    assert one_shot["loss"].tolist()[2] == pytest.approx(BASE_LOSS + 0.1 + 0.2)
    assert iterative["loss"].tolist()[2] == pytest.approx(BASE_LOSS + 0.1 + 0.3)


def test_random_is_deterministic_per_seed_and_differs_across_seeds():
    first, again = curves_for(["random"], seed=3, random_seeds=3), curves_for(["random"], seed=3, random_seeds=3)
    pd.testing.assert_frame_equal(first, again)
    assert sorted(first["seed"].unique()) == [9, 10, 11]
    losses = {seed: tuple(c["loss"]) for seed, c in first.groupby("seed")}
    assert len(set(losses.values())) > 1  # replicates differ
    other = curves_for(["random"], seed=4, random_seeds=3)
    assert not set(tuple(c["loss"]) for _, c in other.groupby("seed")) <= set(losses.values())


def test_single_head_without_deltas_is_skipped_with_a_message(caplog):
    with caplog.at_level(logging.WARNING, logger="headcount.ablation.methods.pruning"):
        curves = curves_for(["single_head", "gradient"], single_head_delta=None)
    assert set(curves["order"]) == {"gradient"}
    assert "single_head skipped" in caplog.text
    with caplog.at_level(logging.WARNING, logger="headcount.ablation.methods.pruning"):
        assert list(curves_for(["single_head"], single_head_delta=None).columns) == CURVE_COLUMNS


@pytest.mark.parametrize(
    "overrides, key",
    [
        ({"step": 0.0}, "ablation.pruning.step"),
        ({"step": 1.5}, "ablation.pruning.step"),
        ({"orders": ["magnitude"]}, "ablation.pruning.orders"),
        ({"random_seeds": 0}, "ablation.pruning.random_seeds"),
    ],
)
def test_bad_pruning_config_is_refused(overrides, key):
    cfg = PruningConfig(**overrides)
    with pytest.raises(ConfigError, match=key):
        pruning_curves(ToyEvaluator(), CountingImportance(), COST_LH, HEADS_PER_LAYER, cfg, 0, {"loss": 1.0})


def test_real_model_curves_start_at_the_baseline():
    """The real gradient importance and an evaluator made of plain forward passes, on a tiny model."""
    torch.manual_seed(0)
    cfg = ModelConfig(n_layers=2, d_model=16, n_ctx=8, vocab_size=10, attn=AttentionConfig(n_heads=2), mlp=True)
    model = Transformer(cfg).double().eval()
    g = torch.Generator().manual_seed(0)
    batch = {"input_ids": torch.randint(0, 10, (4, 8), generator=g), "loss_mask": torch.ones(4, 8, dtype=torch.bool)}

    def loss_and_acc(gates=None) -> tuple[float, float]:
        logits = model(batch["input_ids"], None if gates is None else gated(gates))
        nll, correct = token_nll_and_correct(logits, batch["input_ids"])
        return nll.mean().item(), correct.mean().item()

    def evaluate(masks_MLH):
        with torch.no_grad():
            results = [loss_and_acc(mask_LH.double()) for mask_LH in masks_MLH]
        return {
            "loss": torch.tensor([r[0] for r in results], dtype=torch.float64),
            "acc": torch.tensor([r[1] for r in results]),
        }

    baseline = dict(zip(("loss", "acc"), loss_and_acc()))
    curves = pruning_curves(
        evaluate,
        lambda mask_LH: gradient_importance(model, [batch], mask_LH=mask_LH),
        None,
        model.heads_per_layer,
        PruningConfig(step=0.25, orders=["gradient", "gradient_iterative", "random"], random_seeds=2),
        0,
        baseline,
    )
    assert len(curves) == 4 * 5
    assert (curves.loc[curves["fraction"] == 0, "delta_loss"] == 0).all()
    all_off = curves.loc[curves["fraction"] == 1.0, "loss"]
    assert all_off.tolist() == pytest.approx([loss_and_acc(torch.zeros(2, 2, dtype=torch.float64))[0]] * 4)


def hand_made_curves(losses_by_curve: dict) -> pd.DataFrame:
    rows = [
        (order, seed, fraction, n_pruned, loss, 0.0, 0.0, False)
        for (order, seed), losses in losses_by_curve.items()
        for fraction, n_pruned, loss in zip([0.0, 0.25, 0.5, 0.75, 1.0], [0, 1, 2, 3, 4], losses)
    ]
    return pd.DataFrame(rows, columns=CURVE_COLUMNS).sample(frac=1, random_state=0)  # row order must not matter


def test_prunable_fraction_stops_at_the_first_step_out_of_tolerance():
    curves = hand_made_curves(
        {
            ("gradient", 0): [2.0, 2.01, 2.05, 2.0, 3.0],  # dips back in at 0.75: does not count
            ("single_head", 0): [2.0, 2.0, 2.0, 2.0, 2.0],
            ("gradient_iterative", 0): [2.5, 2.0, 2.0, 2.0, 2.0],  # out already at 0
            ("random", 0): [2.0, 2.03, 2.0, 2.1, 3.0],  # alone it would stop at 0; the mean over seeds decides
            ("random", 1): [2.0, 2.0, 2.03, 2.0, 3.0],
        }
    )
    assert prunable_fractions(curves, baseline_loss=2.0, tolerance=0.01) == {
        "gradient": 0.25,
        "single_head": 1.0,
        "gradient_iterative": 0.0,
        "random": 0.5,
    }


def test_prunable_fraction_counts_heads_really_removed():
    # Two heads in 10% steps: 0.1 and 0.2 remove no head (round(0.2) = 0), 0.3 removes one.
    fractions, n_pruned = [0.0, 0.1, 0.2, 0.3, 1.0], [0, 0, 0, 1, 2]
    rows = [("gradient", 0, f, n, loss, 0.0, 0.0, False) for f, n, loss in zip(fractions, n_pruned, [2, 2, 2, 9, 9])]
    curves = pd.DataFrame(rows, columns=CURVE_COLUMNS)
    assert prunable_fractions(curves, baseline_loss=2.0, tolerance=0.01) == {"gradient": 0.0}


def test_prunable_fraction_tolerance_edges():
    curves = hand_made_curves({("gradient", 0): [2.0, 2.5, 3.0, 3.0 + 1e-12, 4.0]})
    assert prunable_fractions(curves, baseline_loss=2.0, tolerance=0.5) == {"gradient": 0.5}  # 3.0 is on the edge
    assert prunable_fractions(curves, baseline_loss=2.0, tolerance=0.0) == {"gradient": 0.0}
    assert prunable_fractions(curves, baseline_loss=2.0, tolerance=1.0) == {"gradient": 1.0}
    with pytest.raises(ConfigError, match="ablation.pruning.tolerance"):
        prunable_fractions(curves, baseline_loss=2.0, tolerance=-0.1)
