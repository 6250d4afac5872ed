"""Head findings on a real pretrained model (experiment pretrained_heads: SmolLM2-135M, 30 layers x 9 query heads
sharing 3 key/value heads a layer, evaluated as it is, on Python source in its own tokenizer):

(1) most heads can be removed alone at little cost (Michel et al. 2019): every head's cost screened by attribution
    patching on the whole evaluation set, the costliest evaluated exactly (or an exact single_head scan, where run);
(2) induction heads: their score on repeated random tokens finds them, and zeroing the top k by score destroys
    in-context copying while k random heads do not (Olsson et al. 2022);
(3) gradient-importance order prunes 20-40% of heads within 1% (and within 5%), more than a random order (Michel),
    read on the paper's definition (the expectation over examples: order gradient_per_example) with the per-batch
    form beside it, and both forms' rank correlation with the heads' costs;
(4) what a whole key/value group costs against its query heads removed alone (the kv_groups scan).

Each claim's verdict is a function of plain tables (the *_claim functions), so it can be tested on made-up numbers.
"""

from pathlib import Path

import pandas as pd

from headcount.ablation.engine.heads import head_name
from headcount.ablation.methods.pruning import prunable_fractions
from headcount.ablation.records.results import read_checked
from headcount.findings import figures
from headcount.findings.claims import FINDINGS, Claim, Finding, FindingChecker, verdict
from headcount.findings.copying import CopyingProbe, copying_probe, repeated_random_batches
from headcount.findings.induction import FAR_BELOW, INDUCTION_PATTERN
from headcount.findings.run_data import run_subject, scan_file, scan_results
from headcount.findings.sixteen_heads import LITTLE, PRUNABLE_CLAIM, copied
from headcount.findings.stability import ranking_stability
from headcount.plotting import head_heatmap
from headcount.run_dir import load_run

PAPERS = (
    "Michel et al. 2019, Are Sixteen Heads Really Better than One?; "
    "Olsson et al. 2022, In-context learning and induction heads"
)
TOLERANCES = (0.01, 0.05)  # the pruning claim's bars: the 1%, and 5% as the looser reading of "no drop"
TOP_K_SHARE = 0.03  # "a few heads": k = 3% of the heads (8 of SmolLM2's 270), at least one
RANDOM_DRAWS = 5  # random k-head sets the top k are compared with
DESTROYED = 0.5  # zeroing the top k gives back at least half of what copying saves on the repeat...
RANDOM_LITTLE = 0.1  # ...while k random heads give back under a tenth of it
PROBE_SEQUENCES = 256  # repeated sequences when the run evaluates on a whole split (ablation.n_eval=null)


def check(run_dir: Path, out: Path) -> Finding:
    summary, (curves, kv) = scan_results(run_dir, ["pruning", "kv_groups"])
    single, costs_from = head_costs(run_dir)
    importance = read_checked(scan_file(run_dir, "importance", ".csv"))
    baseline = summary["baseline_loss"]
    run = load_run(run_dir)
    n_heads = sum(run.model.heads_per_layer)
    a, d = run.config.ablation, run.config.data
    k = max(1, round(TOP_K_SHARE * n_heads))
    batches = repeated_random_batches(
        run.model.cfg.vocab_size, a.n_eval or PROBE_SEQUENCES, d.seq_len // 2, a.batch_size, a.seed
    )
    probe = copying_probe(run.model, batches, k, RANDOM_DRAWS, a.seed, stability=True)
    arbitrary = bool({"gradient", "gradient_per_example"} & set(summary.get("arbitrary_orders", [])))

    claims, numbers = [], {"baseline_loss": baseline, "n_heads": n_heads, "head_costs_from": costs_from}
    numbers |= importance_agreement(importance, single)
    for claim, claim_numbers in (
        single_head_claim(single, baseline, costs_from),
        *copying_claims(probe, n_heads),
        pruning_claim(curves, baseline, arbitrary, numbers),
        kv_groups_claim(kv, single, baseline),
    ):
        claims.append(claim)
        numbers.update(claim_numbers)
    subject = run_subject(run_dir)
    repeat_losses = {
        "all heads": [probe.repeated_loss],
        f"top {k} by\ninduction score\nzeroed": [probe.top_k_loss],
        f"{k} random\nheads zeroed": probe.random_k_losses,
        "first half\n(nothing to copy)": [probe.first_half_loss],
    }
    figure = figures.pretrained_panels(
        single.delta_loss / baseline, repeat_losses, kv_costs(kv, single), LITTLE, out / "pretrained_heads.png", subject
    )
    scores = head_heatmap(
        probe.heads,
        out / "induction_scores.png",
        "induction_score",
        f"Induction score on repeated random tokens (share of attention)\n{subject}",
        "share of attention on the token after the current token's first occurrence",
    )
    scan_figures = [scan_file(run_dir, name, ".png") for name in ("attribution", "pruning", "kv_groups")]
    scans = copied([path for path in scan_figures if path.exists()], out)
    return Finding("pretrained_heads", PAPERS, claims, numbers, [figure, scores, *scans])


def head_costs(run_dir: Path) -> tuple[pd.DataFrame, str]:
    """Each head's single-head loss increase (layer, head, delta_loss): from an exact single_head scan where the run
    has one, else from the attribution screen, exact for the heads it verified and estimated for the rest; and
    where the numbers come from, in words."""
    single = scan_file(run_dir, "single_head", ".csv")
    if single.exists():
        return read_checked(single)[["layer", "head", "delta_loss"]], "an exact single_head scan"
    screen = read_checked(scan_file(run_dir, "attribution", ".csv"))
    verified = screen["verified"].astype(str) == "True"
    exact = pd.to_numeric(screen["exact"], errors="coerce")  # an unverified head's cell reads back as ""
    costs = screen.assign(delta_loss=exact.where(verified, screen["attribution"]))
    cheapest_verified = float(costs.loc[verified, "delta_loss"].abs().min()) if verified.any() else float("nan")
    words = (
        f"attribution patching for all {len(screen)} heads, the {int(verified.sum())} of largest estimated cost "
        f"evaluated exactly (the least of them {cheapest_verified:.4f} nats)"
    )
    return costs[["layer", "head", "delta_loss"]], words


def importance_agreement(importance: pd.DataFrame, single: pd.DataFrame) -> dict:
    """Spearman's rho of each gradient-importance form with the heads' single-head costs."""
    both = importance.merge(single, on=["layer", "head"])
    rho = lambda column: float(both[column].rank().corr(both["delta_loss"].rank()))  # noqa: E731
    forms = {"per_batch": "grad_importance_raw", "per_example": "grad_importance_per_example_raw"}
    return {f"importance_{form}_spearman_with_costs": rho(column) for form, column in forms.items() if column in both}


def single_head_claim(single: pd.DataFrame, baseline: float, costs_from: str = "") -> tuple[Claim, dict]:
    """(1) from the heads' single-head costs (delta_loss per head)."""
    relative = single.delta_loss / baseline
    share = float((relative < LITTLE).mean())
    numbers = {
        "share_of_heads_under_1pct": share,
        "largest_single_head_increase_pct": float(100 * relative.max()),
        "share_of_heads_that_lower_the_loss": float((single.delta_loss < 0).mean()),
    }
    source = f" (costs from {costs_from})" if costs_from else ""
    claim = Claim(
        "(1) Most heads can be removed alone at little cost: under 1% more loss on real code (Michel et al. 2019)",
        f"{share:.0%} of {len(single)} heads under 1% (largest increase {100 * relative.max():.1f}%){source}",
        verdict(share > 0.5, partly=share > 0.25),
    )
    return claim, numbers


def copying_claims(probe: CopyingProbe, n_heads: int) -> list[tuple[Claim, dict]]:
    """(2a) the scores find induction heads and the model copies; (2b) zeroing the top k destroys copying, k random
    heads do not. 'Undone' is the share of copying's saving (first half's loss - repeat's loss) an ablation takes
    back. (2b) rests on the ranking by induction score: it is only reproduced when the top k are stable over
    resamples of the sequences (probe.top_k_stability; findings/stability.py)."""
    k = len(probe.top_k)
    saving = probe.first_half_loss - probe.repeated_loss
    top_scores = probe.heads.set_index(["layer", "head"]).induction_score.loc[probe.top_k]
    n_found = int((probe.heads.induction_score > INDUCTION_PATTERN).sum())
    copies = probe.repeated_loss <= FAR_BELOW * probe.first_half_loss
    random_mean = sum(probe.random_k_losses) / len(probe.random_k_losses)
    top_back = (probe.top_k_loss - probe.repeated_loss) / saving if saving > 0 else 0.0
    random_back = (random_mean - probe.repeated_loss) / saving if saving > 0 else 0.0
    names = [head_name(layer, head) for layer, head in probe.top_k]
    numbers = {
        "first_half_loss": probe.first_half_loss,
        "repeated_half_loss": probe.repeated_loss,
        "heads_with_induction_score_over_0.3": n_found,
        "top_k": k,
        "top_k_heads": names,
        "top_k_induction_scores": [float(v) for v in top_scores],
        "top_k_zeroed_repeated_loss": probe.top_k_loss,
        "random_k_zeroed_repeated_losses": probe.random_k_losses,
        "top_k_share_of_copying_undone": top_back,
        "random_k_share_of_copying_undone": random_back,
    }
    found = Claim(
        "(2a) The model copies in context, and the induction score on repeated random tokens singles out induction "
        f"heads (score > {INDUCTION_PATTERN}; Olsson et al. 2022)",
        f"repeated half {probe.repeated_loss:.2f} nats against {probe.first_half_loss:.2f} on the first half; "
        f"{n_found} of {n_heads} heads score > {INDUCTION_PATTERN}, top {k}: "
        + ", ".join(f"{n} {s:.2f}" for n, s in zip(names, top_scores)),
        verdict(copies and n_found >= k, partly=copies or n_found > 0),
    )
    targeted = top_back >= DESTROYED and random_back < RANDOM_LITTLE
    measured = (
        f"top {k}: repeated half {probe.repeated_loss:.2f} -> {probe.top_k_loss:.2f} nats ({top_back:.0%} undone); "
        f"{k} random heads ({len(probe.random_k_losses)} draws): {random_mean:.2f} nats ({random_back:.0%} undone)"
    )
    if saving <= 0:
        measured = f"the model does not copy: the repeated half ({probe.repeated_loss:.2f} nats) is no cheaper"
    ablated = Claim(
        f"(2b) Zeroing the top {k} heads by induction score destroys in-context copying (undoes at least "
        f"{DESTROYED:.0%} of it); {k} random heads do not (under {RANDOM_LITTLE:.0%})",
        measured,
        verdict(saving > 0 and targeted, partly=saving > 0 and top_back > max(2 * random_back, 0.05)),
    )
    ablated, stability = ranking_stability(
        ablated, probe.top_k_stability, "heads by induction score", "top_k_bootstrap_overlap"
    )
    return [(found, numbers), (ablated, stability)]


def pruning_claim(
    curves: pd.DataFrame, baseline: float, arbitrary: bool, agreement: dict | None = None
) -> tuple[Claim, dict]:
    """(3) from the pruning table: the gradient order on the paper's definition (gradient_per_example) where it ran,
    else the per-batch one (gradient), against random; the per-batch form and the forms' agreement with the heads'
    costs (`agreement`: importance_agreement's numbers) beside it."""
    within = {tol: prunable_fractions(curves, baseline, tol) for tol in TOLERANCES}
    order = "gradient_per_example" if "gradient_per_example" in set(curves["order"]) else "gradient"
    gradient = {tol: within[tol][order] for tol in TOLERANCES}
    random = {tol: within[tol]["random"] for tol in TOLERANCES}
    tight, loose = TOLERANCES
    numbers = {
        **{f"prunable_gradient_within_{100 * t:g}pct": gradient[t] for t in TOLERANCES},
        **{f"prunable_random_within_{100 * t:g}pct": random[t] for t in TOLERANCES},
        "gradient_order_arbitrary": arbitrary,
    }
    if order != "gradient" and "gradient" in set(curves["order"]):
        numbers |= {f"prunable_gradient_per_batch_within_{100 * t:g}pct": within[t]["gradient"] for t in TOLERANCES}
    measured = "; ".join(
        f"within {100 * t:g}%: {order.replace('_', ' ')} {gradient[t]:.0%}, random {random[t]:.0%}"
        + (f", per batch {within[t]['gradient']:.0%}" if order != "gradient" and "gradient" in within[t] else "")
        for t in TOLERANCES
    ) + ("; but every head got the same importance, so the gradient order is arbitrary" if arbitrary else "")
    if agreement:
        numbers |= agreement
        forms = [(form, agreement.get(f"importance_per_{form}_spearman_with_costs")) for form in ("example", "batch")]
        measured += "; Spearman of importance with the heads' costs: " + ", ".join(
            f"per {form} {value:.2f}" for form, value in forms if value is not None
        )
    beats = {t: gradient[t] > random[t] for t in TOLERANCES}
    holds = not arbitrary and gradient[tight] >= PRUNABLE_CLAIM and beats[tight]
    partly = not arbitrary and ((gradient[loose] >= PRUNABLE_CLAIM and beats[loose]) or any(beats.values()))
    claim = Claim(
        "(3) Gradient-importance order prunes 20-40% of heads within 1% of the loss, more than a random order "
        "(Michel et al. 2019)",
        measured,
        verdict(holds, partly=partly),
    )
    return claim, numbers


def kv_costs(kv: pd.DataFrame, single: pd.DataFrame) -> pd.DataFrame:
    """Per key/value group: layer, kv_head, n_heads_off, delta_loss (the group off) and single_sum (its query heads'
    single-head delta_loss added up). A group's query heads are consecutive, in kv_head order."""
    single_LH = single.set_index(["layer", "head"]).delta_loss
    rows = []
    for layer, groups in kv.sort_values(["layer", "kv_head"]).groupby("layer"):
        first = 0
        for row in groups.itertuples():
            heads = [(layer, h) for h in range(first, first + row.n_heads_off)]
            rows.append((layer, row.kv_head, row.n_heads_off, row.delta_loss, float(single_LH.loc[heads].sum())))
            first += row.n_heads_off
    return pd.DataFrame(rows, columns=["layer", "kv_head", "n_heads_off", "delta_loss", "single_sum"])


def kv_groups_claim(kv: pd.DataFrame, single: pd.DataFrame, baseline: float) -> tuple[Claim, dict]:
    """(4) from the kv_groups and single_head tables. No paper measures this on grouped-query models; the claim is
    the expectation that query heads sharing keys and values do not stand in for each other, so a group costs at
    least what its heads cost one at a time, and fewer groups than heads can go alone."""
    costs = kv_costs(kv, single)
    grouped = bool((costs.n_heads_off > 1).any())
    superadditive = float((costs.delta_loss >= costs.single_sum).mean())
    groups_little = float((costs.delta_loss / baseline < LITTLE).mean())
    heads_little = float((single.delta_loss / baseline < LITTLE).mean())
    numbers = {
        "n_kv_groups": len(costs),
        "share_of_groups_under_1pct": groups_little,
        "share_of_groups_costing_at_least_their_heads_sum": superadditive,
        "median_group_delta": float(costs.delta_loss.median()),
        "median_group_heads_single_sum": float(costs.single_sum.median()),
        "largest_group_increase_pct": float(100 * costs.delta_loss.max() / baseline),
    }
    if not grouped:
        measured = "no grouped-query attention (each key/value head serves one query head): nothing to compare"
        holds = partly = False
    else:
        measured = (
            f"{superadditive:.0%} of {len(costs)} groups cost at least the sum of their query heads alone (median "
            f"{costs.delta_loss.median():.4f} against {costs.single_sum.median():.4f} nats); {groups_little:.0%} of "
            f"groups under 1% against {heads_little:.0%} of single query heads"
        )
        holds = superadditive > 0.5 and groups_little < heads_little
        partly = superadditive > 0.5 or groups_little < heads_little
    claim = Claim(
        "(4) A key/value group (all query heads sharing a key/value head: what pruning must remove to shrink the "
        "key/value cache) costs at least its query heads' single costs added up, and fewer groups than heads can go "
        "alone within 1% (no published number: the expectation for heads that do not stand in for each other)",
        measured,
        verdict(holds, partly=partly),
    )
    return claim, numbers


FINDINGS.register(
    FindingChecker(
        "pretrained_heads",
        check,
        "run",
        ("attribution", "importance", "pruning", "kv_groups"),
        "Michel et al. 2019; Olsson et al. 2022 on SmolLM2-135M",
    )
)
