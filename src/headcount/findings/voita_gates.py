"""Voita et al. (2019), "Analyzing Multi-Head Self-Attention": learned L0 (hard-concrete) head gates keep a small
subset of heads at little cost, doing better than pruning by an importance order at equal heads, and the heads they
keep are the important ones."""

from pathlib import Path

import numpy as np
import pandas as pd

from headcount.findings import figures
from headcount.findings.claims import FINDINGS, Claim, Finding, FindingChecker, verdict
from headcount.findings.run_data import run_subject, scan_results

PAPER = "Voita et al. 2019, Analyzing Multi-Head Self-Attention"
CLOSE = 0.05  # "little cost": L0 gates' loss within 5% of the full model's


def check(run_dir: Path, out: Path) -> Finding:
    summary, (gates, curves, importance) = scan_results(run_dir, ["l0_gates", "pruning", "importance"])
    baseline = summary["baseline_loss"]
    n_heads = len(importance)

    runs = gates.drop_duplicates("target_heads")[["target_heads", "n_kept", "loss"]].reset_index(drop=True)
    gradient = curves[curves.order == "gradient"].assign(kept=lambda c: n_heads - c.n_pruned).sort_values("kept")
    runs["gradient_loss"] = np.interp(runs.n_kept, gradient.kept, gradient.loss)
    # "Important" two ways: the cost of removing the head alone, and Michel's layer-normalised gradient importance
    for column, score in [
        ("overlap_with_top_ablation", "single_head_delta"),
        ("overlap_with_top_gradient", "grad_importance"),
    ]:
        ranked = importance.sort_values(score, ascending=False)
        runs[column] = [
            overlap(gates[(gates.target_heads == t) & gates.kept], ranked.head(k))
            for t, k in zip(runs.target_heads, runs.n_kept)
        ]
    runs["chance_overlap"] = runs.n_kept / n_heads

    close = runs[runs.loss <= (1 + CLOSE) * baseline]
    fewest = int(close.n_kept.min()) if len(close) else None
    better = int((runs.loss <= runs.gradient_loss).sum())
    above_chance = runs.overlap_with_top_ablation > runs.chance_overlap
    numbers = {
        "baseline_loss": baseline,
        "n_heads": n_heads,
        "runs": runs.to_dict(orient="records"),
        "fewest_heads_within_5pct": fewest,
        "runs_at_or_below_gradient_curve": better,
    }
    rows = "; ".join(
        f"{r.n_kept} heads: loss {r.loss:.3f} (gradient order {r.gradient_loss:.3f})" for r in runs.itertuples()
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
            "share of the kept heads among as many top heads by single-head ablation cost: "
            + ", ".join(f"{r.overlap_with_top_ablation:.0%}" for r in runs.itertuples())
            + "; by layer-normalised gradient importance: "
            + ", ".join(f"{r.overlap_with_top_gradient:.0%}" for r in runs.itertuples())
            + "; by chance: "
            + ", ".join(f"{r.chance_overlap:.0%}" for r in runs.itertuples()),
            verdict(
                bool(above_chance.all()) and bool((runs.overlap_with_top_ablation >= 0.5).all()),
                partly=bool(above_chance.any()),
            ),
        ),
    ]
    subject = run_subject(run_dir)
    figure = figures.l0_against_pruning(runs, curves, n_heads, baseline, out / "voita_gates.png", subject)
    return Finding("voita_gates", PAPER, claims, numbers, [figure])


def overlap(kept: pd.DataFrame, top: pd.DataFrame) -> float:
    """The share of the kept heads that are among the top heads (as many as kept)."""
    kept_heads = set(zip(kept.layer, kept["head"]))
    return len(kept_heads & set(zip(top.layer, top["head"]))) / max(len(kept_heads), 1)


FINDINGS.register(
    FindingChecker(
        "voita_gates",
        check,
        "run",
        ("l0_gates", "pruning", "importance"),
        "Voita et al. 2019: L0 gates keep few heads at little cost",
    )
)
