"""Olsson et al. (2022): a 2-layer attention-only model copies in context through previous-token heads in layer 0 and
induction heads in layer 1. The heads are the ones the attention patterns single out (previous-token score above
PREV_TOKEN_PATTERN in layer 0, induction score above INDUCTION_PATTERN in layer 1), each role's heads zeroed TOGETHER,
as Olsson et al. ablate them: a model may split a role between heads that back each other up, and which heads share it
moves with the seed, the thread count and the CPU kind, so a claim about one head would too. The claims: zeroing
layer 0's previous-token heads costs more than 1 nat on the repeated part, and so does zeroing layer 1's induction
heads; the pattern heads carry the task (zeroed together over 1 nat) and the other heads, zeroed together, cost under
1 nat; every head that costs over 1 nat alone is a pattern head of either role (when the pattern heads back each other
up none may, and then they are singled out together); and the previous-token heads reach the induction heads through
their keys (K-composition): of the exact edge scores (edge_attribution, zero mode: the edge's sender output zeroed for
that one receiver input) between the two roles' heads, more lands on the induction heads' .k than on their .q or .v.
Each head's own
score and single-head delta are reported beside the joint numbers."""

import math
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from headcount.ablation.engine.heads import head_name
from headcount.ablation.engine.masks import HeadMask, joined_name, masks_to_gates
from headcount.ablation.records.address import ResultAddress
from headcount.ablation.records.results import read_checked
from headcount.ablation.records.summary import read_mode_summary
from headcount.ablation.scans.head_scores import SCORES
from headcount.data import induction_first_part_mask
from headcount.findings import figures
from headcount.findings.claims import FINDINGS, Claim, Finding, FindingChecker, verdict
from headcount.findings.run_data import run_evaluator, run_subject
from headcount.findings.stability import ranking_stability
from headcount.labels import receiver_head
from headcount.run_dir import FinishedRun, RunPaths, load_run

PAPER = "Olsson et al. 2022, In-context learning and induction heads"
CRITICAL = 1.0  # nats on the repeated part: the bar for a head (or a role's heads) that carries the task
INDUCTION_PATTERN = 0.3  # a layer-1 head that puts this much attention on induction targets is an induction head
# A layer-0 head that puts this much attention on the previous token is a previous-token head. The score averages over
# every position, filler included: the heads of seeds that build the circuit score about 0.3 (0.19 while it forms, at
# 2500 steps), the top heads of seeds that solve the task without it 0.02-0.09.
PREV_TOKEN_PATTERN = 0.15
FAR_BELOW = 0.25  # "far below": the repeated part's loss at most this fraction of a context-free guess

Heads = list[tuple[int, int]]  # (layer, head) pairs


def head_table(run_dir: Path) -> pd.DataFrame:
    """layer, head, prev_token_score, induction_score, delta_loss (single-head zero ablation, whatever mode else the
    run also ran: the claims are about zeroed heads), a row per head."""
    zero = ResultAddress(RunPaths(run_dir).ablation, mode="zero")
    scores = read_checked(zero.file("head_scores", ".csv", mode_independent=True))[["layer", "head", *SCORES]]
    single = read_checked(zero.file("single_head", ".csv"))[["layer", "head", "delta_loss"]]
    return scores.merge(single, on=["layer", "head"])


def edge_table(run_dir: Path) -> pd.DataFrame | None:
    """The exact edge scores of the zero-mode edge_attribution scan (edge, sender, receiver, exact), if it ran."""
    path = ResultAddress(RunPaths(run_dir).ablation, mode="zero").file("edge_attribution", ".csv")
    return read_checked(path)[["edge", "sender", "receiver", "exact"]] if path.exists() else None


def name(row: pd.Series) -> str:
    return head_name(row.layer, row["head"])


def pattern_heads(heads: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The heads the attention patterns single out: layer 0's previous-token heads and layer 1's induction heads."""
    layer0, layer1 = heads[heads.layer == 0], heads[heads.layer == 1]
    return layer0[layer0.prev_token_score > PREV_TOKEN_PATTERN], layer1[layer1.induction_score > INDUCTION_PATTERN]


def zeroing_together(run: FinishedRun, repeated: float) -> Callable[[Heads], float]:
    """(layer, head) pairs -> the repeated-part loss increase with all of them zeroed at once (0 for none)."""
    evaluator = run_evaluator(run)

    def increase(zeroed: Heads) -> float:
        if not zeroed:
            return 0.0
        gates_1LH = masks_to_gates([HeadMask(joined_name(tuple(zeroed)), tuple(zeroed))], run.model.heads_per_layer)
        return float(evaluator.evaluate(gates_1LH)["loss"][0]) - repeated

    return increase


def composition_claim(edges: pd.DataFrame, prev_heads: list[str], induction_heads: list[str]) -> tuple[Claim, dict]:
    """K-composition, read per role as claims 2 and 3 are: the exact edges (loss increase when the edge alone is
    zeroed) from the previous-token heads into the induction heads carry more through the induction heads' keys
    than through their queries or values, summed over both roles' heads (heads that share a role split an edge's
    weight between them, so the single largest edge moves with the seed; the sum does not)."""
    between = edges[edges.sender.isin(prev_heads) & edges.receiver.map(receiver_head).isin(induction_heads)]
    by_input = {w: float(between[between.receiver.str.endswith(f".{w}")].exact.sum()) for w in "qkv"}
    numbers = {"prev_to_induction_exact_by_input": by_input, "prev_to_induction_edges": len(between)}
    if between.empty:
        return Claim(COMPOSITION, "no previous-token head or no induction head by pattern", verdict(False)), numbers
    top = between.sort_values("exact", ascending=False).iloc[0]
    numbers.update({"largest_prev_to_induction_edge": top.edge, "largest_prev_to_induction_exact": float(top.exact)})
    measured = (
        f"the {len(between)} edges from {', '.join(prev_heads)} into {', '.join(induction_heads)}, summed: "
        + ", ".join(f".{w} {v:+.3f}" for w, v in by_input.items())
        + f" nats; the largest, {top.edge} {top.exact:+.3f}"
    )
    k_leads = by_input["k"] > max(by_input["q"], by_input["v"], 0.0)
    return Claim(COMPOSITION, measured, verdict(k_leads)), numbers


COMPOSITION = (
    "The previous-token heads reach the induction heads through their keys (K-composition): the exact edges between "
    "the two roles' heads carry more into the induction heads' .k than into their .q or .v"
)


def prev_token_measured(prev_heads: pd.DataFrame, joint: float) -> str:
    """Each previous-token head with its score and single-head delta, then their joint delta."""
    if prev_heads.empty:
        return f"no layer-0 head has previous-token score > {PREV_TOKEN_PATTERN}"
    each = ", ".join(
        f"{name(row)} ({row.prev_token_score:.2f}, {row.delta_loss:+.2f} alone)" for _, row in prev_heads.iterrows()
    )
    return f"{len(prev_heads)} with previous-token score > {PREV_TOKEN_PATTERN}: {each}; together {joint:+.2f} nats"


def claims_of(
    heads: pd.DataFrame,
    together: Callable[[Heads], float],
    repeated: float,
    first: float,
    guess: float,
    stability: dict | str | None = None,
) -> tuple[list[Claim], dict]:
    """The five claims on the head table (and the repeated part's loss), `together` zeroing heads at once.
    stability: the single_head scan's summary `intervals` entry; the last claim (which heads the ablation singles out)
    says it and is only reproduced when the single-head ranking's top is stable (findings/stability.py)."""
    prev_heads, induction_heads = pattern_heads(heads)
    layer0, layer1 = heads[heads.layer == 0], heads[heads.layer == 1]
    top_prev = layer0.loc[layer0.prev_token_score.idxmax()]
    top_induction = layer1.loc[layer1.induction_score.idxmax()]
    prev_joint = together([(0, int(h)) for h in prev_heads["head"]])
    induction_joint = together([(1, int(h)) for h in induction_heads["head"]])

    circuit = pd.concat([prev_heads, induction_heads])
    by_pattern = {name(row) for _, row in circuit.iterrows()}
    others = heads[~heads.apply(name, axis=1).isin(by_pattern)]
    circuit_joint = together([(int(r.layer), int(r["head"])) for _, r in circuit.iterrows()])
    others_joint = together([(int(r.layer), int(r["head"])) for _, r in others.iterrows()])
    critical = heads[heads.delta_loss > CRITICAL]
    critical_names = [name(row) for _, row in critical.iterrows()]
    explained = [h for h in critical_names if h in by_pattern]

    numbers = {
        "first_part_loss": first,
        "context_free_guess_loss": guess,
        "repeated_part_loss": repeated,
        "prev_token_heads": [name(row) for _, row in prev_heads.iterrows()],
        "prev_token_head_scores": {name(row): float(row.prev_token_score) for _, row in prev_heads.iterrows()},
        "prev_token_head_deltas": {name(row): float(row.delta_loss) for _, row in prev_heads.iterrows()},
        "prev_token_heads_joint_delta": prev_joint,
        "top_prev_token_head": name(top_prev),
        "top_prev_token_head_score": float(top_prev.prev_token_score),
        "induction_heads": [name(row) for _, row in induction_heads.iterrows()],
        "induction_heads_joint_delta": induction_joint,
        "top_induction_head": name(top_induction),
        "top_induction_head_score": float(top_induction.induction_score),
        "top_induction_head_delta": float(top_induction.delta_loss),
        "critical_heads": critical_names,
        "critical_heads_singled_out_by_patterns": len(explained),
        "pattern_heads_joint_delta": circuit_joint,
        "other_heads": [name(row) for _, row in others.iterrows()],
        "other_heads_joint_delta": others_joint,
    }
    top_single = (
        f"; the top, {name(top_induction)} ({top_induction.induction_score:.2f}), {top_induction.delta_loss:+.2f} alone"
    )
    claims = [
        Claim(
            "The model copies in context: the repeated part's loss is far below the first part's",
            f"repeated part {repeated:.3f} nats against {guess:.2f} for a guess without context (the first part, "
            f"which the model is not trained on, costs {first:.2f})",
            verdict(repeated <= FAR_BELOW * guess),
        ),
        Claim(
            "Zeroing layer 0's previous-token heads (those the attention patterns single out, together) raises the "
            "repeated-part loss by more than 1 nat",
            prev_token_measured(prev_heads, prev_joint),
            verdict(len(prev_heads) > 0 and prev_joint > CRITICAL),
        ),
        Claim(
            "Zeroing layer 1's induction heads (those the attention patterns single out, together) raises the "
            "repeated-part loss by more than 1 nat",
            (
                f"{len(induction_heads)} with induction score > {INDUCTION_PATTERN} "
                f"({', '.join(numbers['induction_heads'])}): together {induction_joint:+.2f} nats"
                if len(induction_heads)
                else f"no layer-1 head has induction score > {INDUCTION_PATTERN}"
            )
            + top_single,
            verdict(len(induction_heads) > 0 and induction_joint > CRITICAL),
        ),
        Claim(
            "The heads the attention patterns single out carry the task and the others matter little: zeroing the "
            "others together raises the repeated-part loss by less than 1 nat, zeroing the pattern heads together by "
            "more",
            f"the {len(others)} other heads ({', '.join(numbers['other_heads']) or 'none'}) together "
            f"{others_joint:+.2f} nats; the {len(circuit)} pattern heads together {circuit_joint:+.2f}",
            verdict(len(circuit) > 0 and others_joint < CRITICAL and circuit_joint > CRITICAL),
        ),
        Claim(
            "The heads the ablation singles out are the heads the attention patterns single out: every head whose "
            "zeroing alone costs more than 1 nat is a pattern head (where the pattern heads back each other up, "
            "none may cost that much alone: then the ablation singles them out together)",
            (
                f"{len(explained)} of the {len(critical)} heads over 1 nat alone ({', '.join(critical_names)}) are "
                if len(critical)
                else f"no head costs over 1 nat alone; together {circuit_joint:+.2f} nats: "
            )
            + f"previous-token heads of layer 0 or induction heads of layer 1 by pattern "
            f"({', '.join(sorted(by_pattern)) or 'none'})",
            verdict(
                len(explained) == len(critical) and (len(critical) > 0 or circuit_joint > CRITICAL),
                partly=len(explained) > 0,
            ),
        ),
    ]
    claims[-1], stability_numbers = ranking_stability(
        claims[-1], stability, "single_head by damage", "single_head_top_bootstrap_overlap"
    )
    return claims, numbers | stability_numbers


def check(run_dir: Path, out: Path) -> Finding:
    heads = head_table(run_dir)
    run = load_run(run_dir)
    repeated = run_evaluator(run).baseline()["loss"]
    first = run_evaluator(run, induction_first_part_mask).baseline()["loss"]
    # The first part is random, so no model beats a uniform guess there; ours is not even trained on it (the loss
    # mask covers the repeat), so its first-part loss is reported but the guess is the bar.
    guess = math.log(run.config.data.vocab_size - 1)
    zero = ResultAddress(RunPaths(run_dir).ablation, mode="zero")
    stability = read_mode_summary(zero.folder, zero.section).get("intervals", {}).get("single_head")
    claims, numbers = claims_of(heads, zeroing_together(run, repeated), repeated, first, guess, stability)
    edges = edge_table(run_dir)
    if edges is not None:
        claim, edge_numbers = composition_claim(edges, numbers["prev_token_heads"], numbers["induction_heads"])
        claims.append(claim)
        numbers.update(edge_numbers)
    subject = run_subject(run_dir, ResultAddress(RunPaths(run_dir).ablation, mode="zero"))
    figure = figures.scores_against_ablation(heads, out / "induction_heads.png", CRITICAL, subject)
    return Finding("induction_heads", PAPER, claims, numbers, [figure])


FINDINGS.register(
    FindingChecker(
        "induction_heads",
        check,
        "run",
        ("single_head", "head_scores"),
        "Olsson et al. 2022: induction heads carry in-context copying",
    )
)
