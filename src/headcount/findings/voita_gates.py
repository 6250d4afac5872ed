"""Voita et al. (2019), "Analyzing Multi-Head Self-Attention": learned L0 (hard-concrete) head gates keep a small
subset of heads at little cost, doing better than pruning by an importance order at equal heads, and the heads they
keep are the important ones."""

import json
from pathlib import Path

import numpy as np
import pandas as pd

from headcount.findings import figures
from headcount.findings.claims import Claim, Finding, verdict
from headcount.run_dir import RunPaths

PAPER = "Voita et al. 2019, Analyzing Multi-Head Self-Attention"
CLOSE = 0.05  # "little cost": L0 gates' loss within 5% of the full model's


def check(run_dir: Path, out: Path) -> Finding:
    ablation = RunPaths(run_dir).ablation
    summary = json.loads((ablation / "summary.json").read_text())
    baseline = summary["baseline_loss"]
    gates = pd.read_csv(ablation / "l0_gates.csv")
    curves = pd.read_csv(ablation / "pruning.csv")
    importance = pd.read_csv(ablation / "importance.csv")
    n_heads = len(importance)

    runs = gates.drop_duplicates("target_heads")[["target_heads", "n_kept", "loss"]].reset_index(drop=True)
    gradient = curves[curves.order == "gradient"].assign(kept=lambda c: n_heads - c.n_pruned).sort_values("kept")
    runs["gradient_loss"] = np.interp(runs.n_kept, gradient.kept, gradient.loss)
    ranked = importance.sort_values("grad_importance", ascending=False)
    runs["overlap_with_top_importance"] = [
        overlap(gates[(gates.target_heads == t) & gates.kept], ranked.head(k))
        for t, k in zip(runs.target_heads, runs.n_kept)
    ]
    runs["chance_overlap"] = runs.n_kept / n_heads

    close = runs[runs.loss <= (1 + CLOSE) * baseline]
    fewest = int(close.n_kept.min()) if len(close) else None
    better = int((runs.loss <= runs.gradient_loss).sum())
    above_chance = runs.overlap_with_top_importance > runs.chance_overlap
    numbers = {
        "baseline_loss": baseline,
        "n_heads": n_heads,
        "runs": runs.to_dict(orient="records"),
        "fewest_heads_within_5pct": fewest,
        "runs_at_or_below_gradient_curve": better,
    }
    rows = "; ".join(
        f"{r.n_kept} heads: loss {r.loss:.3f} (gradient order {r.gradient_loss:.3f}), overlap "
        f"{r.overlap_with_top_importance:.0%} (chance {r.chance_overlap:.0%})"
        for r in runs.itertuples()
    )
    claims = [
        Claim(
            "Gates keep a small subset of heads at little cost",
            f"fewest heads within 5% of the full loss ({baseline:.3f}): "
            + (f"{fewest} of {n_heads}" if fewest else "none of the targets"),
            verdict(fewest is not None and fewest <= n_heads / 2, partly=fewest is not None),
        ),
        Claim(
            "At equal heads kept, learned gates lose less than pruning in importance order",
            f"{better} of {len(runs)} gate runs at or below the gradient-importance curve. {rows}",
            verdict(better == len(runs), partly=better > 0),
        ),
        Claim(
            "The heads the gates keep are the important ones",
            "share of kept heads among the top heads by gradient importance: "
            + ", ".join(f"{r.overlap_with_top_importance:.0%}" for r in runs.itertuples()),
            verdict(
                bool(above_chance.all()) and bool((runs.overlap_with_top_importance >= 0.5).all()),
                partly=bool(above_chance.any()),
            ),
        ),
    ]
    figure = figures.l0_against_pruning(runs, curves, n_heads, baseline, out / "voita_gates.png")
    return Finding("voita_gates", PAPER, claims, numbers, [figure])


def overlap(kept: pd.DataFrame, top: pd.DataFrame) -> float:
    """The share of the kept heads that are among the top heads (as many as kept)."""
    kept_heads = set(zip(kept.layer, kept["head"]))
    return len(kept_heads & set(zip(top.layer, top["head"]))) / max(len(kept_heads), 1)
