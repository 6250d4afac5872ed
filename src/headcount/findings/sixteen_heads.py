"""Michel et al. (2019), "Are Sixteen Heads Really Better than One?": (a) most heads can be removed alone at little
cost; (b) pruning in gradient-importance order removes a good share of heads (20-40% in their models) before the loss
moves, far more than a random order; (c) in many layers all heads but one can go."""

from pathlib import Path

from headcount.findings import figures
from headcount.findings.claims import FINDINGS, Claim, Finding, FindingChecker, verdict
from headcount.findings.run_data import run_subject, scan_file, scan_results

PAPER = "Michel et al. 2019, Are Sixteen Heads Really Better than One?"
LITTLE = 0.01  # "little cost": a loss increase under 1% of the baseline loss, the paper's and the bar
PRUNABLE_CLAIM = 0.2  # the low end of the paper's 20-40% of heads prunable
NEARLY = 0.05  # "partly" for all-but-one: within 5%


def check(run_dir: Path, out: Path) -> Finding:
    summary, (single, keep_one) = scan_results(run_dir, ["single_head", "leave_one_in"])
    baseline = summary["baseline_loss"]
    single_rel = single.delta_loss / baseline
    best_keep_one = keep_one.groupby("layer").delta_loss.min() / baseline  # the best head to keep, per layer
    prunable = summary["prunable_fraction"]
    gradient, random = prunable["gradient"], prunable["random"]
    # An order whose heads all scored the same removed them in index order: its fraction is no evidence either way.
    arbitrary = "gradient" in summary.get("arbitrary_orders", [])
    share_little = float((single_rel < LITTLE).mean())
    layers_one_head = int((best_keep_one < LITTLE).sum())
    layers_nearly = int((best_keep_one < NEARLY).sum())
    by_ablation = prunable.get("single_head")
    n_layers = len(best_keep_one)

    numbers = {
        "baseline_loss": baseline,
        "n_heads": len(single),
        "share_of_heads_under_1pct": share_little,
        "share_of_heads_that_lower_the_loss": float((single.delta_loss < 0).mean()),
        "largest_single_head_increase_pct": float(100 * single_rel.max()),
        "prunable_fraction_gradient": gradient,
        "prunable_fraction_random": random,
        "keep_one_best_increase_pct_by_layer": [float(100 * v) for v in best_keep_one],
        "layers_fine_with_one_head": layers_one_head,
        "layers_within_5pct_with_one_head": layers_nearly,
        "prunable_fraction_single_head_order": by_ablation,
        "gradient_order_arbitrary": arbitrary,
    }
    measured_b = (
        f"gradient order {gradient:.0%}, random order {random:.0%} (mean over seeds)"
        + ("" if by_ablation is None else f"; in single-ablation order {by_ablation:.0%}")
        + (
            "; but every head got the same gradient importance, so the gradient order is arbitrary (index order) and "
            "its fraction is no evidence"
            if arbitrary
            else ""
        )
    )
    holds_b = not arbitrary and gradient >= PRUNABLE_CLAIM and gradient > random
    claims = [
        Claim(
            "(a) Most heads can be removed alone at little cost (under 1% more loss)",
            f"{share_little:.0%} of {len(single)} heads (largest increase {100 * single_rel.max():.1f}%)",
            verdict(share_little > 0.5, partly=share_little > 0.25),
        ),
        Claim(
            "(b) Gradient-importance order prunes 20-40% of heads within 1% of the baseline, far more than random",
            measured_b,
            verdict(holds_b, partly=not arbitrary and gradient > random),
        ),
        Claim(
            "(c) Many layers keep their performance with all heads but one removed",
            f"{layers_one_head} of {n_layers} layers within 1% with their best single head, {layers_nearly} within 5%; "
            "per layer: " + ", ".join(f"{100 * v:.1f}%" for v in best_keep_one),
            verdict(layers_one_head > n_layers / 2, partly=layers_nearly > n_layers / 2),
        ),
    ]
    subject = run_subject(run_dir)
    figure = figures.sixteen_heads_panels(single_rel, best_keep_one, LITTLE, out / "sixteen_heads.png", subject)
    pruning = copied([scan_file(run_dir, "pruning", ".png")], out)
    return Finding("sixteen_heads", PAPER, claims, numbers, [figure, *pruning])


def copied(figures: list[Path], out: Path) -> list[Path]:
    """Scan figures the finding cites, copied beside findings.md so the folder reads on its own."""
    paths = []
    for path in figures:
        (out / path.name).write_bytes(path.read_bytes())
        paths.append(out / path.name)
    return paths


FINDINGS.register(
    FindingChecker(
        "sixteen_heads",
        check,
        "run",
        ("single_head", "leave_one_in", "pruning"),
        "Michel et al. 2019: most heads can go",
    )
)
