"""Olsson et al. (2022): a 2-layer attention-only model copies in context through a previous-token head in layer 0
and an induction head in layer 1; ablating either costs more than 1 nat on the repeated part, most heads matter
little, the heads the ablation singles out are the heads the attention patterns single out, and the previous-token
head reaches the induction head through its key (K-composition): of the exact edge scores (edge_attribution, zero
mode: the edge's sender output zeroed for that one receiver input), the largest from a layer-0 head into the top
induction head is the previous-token head's, on .k."""

import math
from pathlib import Path

import pandas as pd
import torch

from headcount.ablation.engine.heads import head_name
from headcount.ablation.records.address import ResultAddress
from headcount.ablation.records.results import read_checked
from headcount.ablation.scans.head_scores import SCORES
from headcount.data import induction_first_part_mask
from headcount.findings import figures
from headcount.findings.claims import FINDINGS, Claim, Finding, FindingChecker, verdict
from headcount.findings.run_data import run_evaluator, run_subject
from headcount.run_dir import RunPaths, load_run

PAPER = "Olsson et al. 2022, In-context learning and induction heads"
CRITICAL = 1.0  # nats on the repeated part: the bar for a head that carries the task
INDUCTION_PATTERN = 0.3  # a layer-1 head that puts this much attention on induction targets is an induction head
# A layer-0 head that puts this much attention on the previous token is a previous-token head. The score averages over
# every position, filler included: the heads of seeds that build the circuit score about 0.3 (0.19 while it forms, at
# 2500 steps), the top heads of seeds that solve the task without it 0.02-0.09.
PREV_TOKEN_PATTERN = 0.15
FAR_BELOW = 0.25  # "far below": the repeated part's loss at most this fraction of a context-free guess


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


def composition_claim(edges: pd.DataFrame, prev_head: str, induction_head: str) -> tuple[Claim, dict]:
    """K-composition: the largest exact edge (loss increase when the edge alone is zeroed) from a layer-0 head into
    the induction head runs from the previous-token head into its key."""
    into = edges[edges.receiver.str.startswith(f"{induction_head}.") & edges.sender.str.match(r"^L0H\d+$")]
    into = into.sort_values("exact", ascending=False)
    top = into.iloc[0]
    from_prev = into[into.sender == prev_head].set_index("receiver")["exact"]
    numbers = {
        "largest_head_edge_into_induction_head": top.edge,
        "largest_head_edge_exact": float(top.exact),
        "prev_token_head_edges_into_induction_head": {r: float(v) for r, v in from_prev.items()},
    }
    measured = f"largest: {top.edge} (+{top.exact:.3f} nats); {prev_head} into " + ", ".join(
        f"{r.split('.')[-1]} {v:+.3f}" for r, v in from_prev.items()
    )
    claim = Claim(
        "The previous-token head reaches the induction head through its key: the largest exact edge from a layer-0 "
        "head into the induction head is previous-token head -> .k (K-composition)",
        measured,
        verdict(top.sender == prev_head and top.receiver == f"{induction_head}.k", partly=top.sender == prev_head),
    )
    return claim, numbers


def check(run_dir: Path, out: Path) -> Finding:
    heads = head_table(run_dir)
    run = load_run(run_dir)
    repeated = run_evaluator(run).baseline()["loss"]
    first = run_evaluator(run, induction_first_part_mask).baseline()["loss"]
    # The first part is random, so no model beats a uniform guess there; ours is not even trained on it (the loss
    # mask covers the repeat), so its first-part loss is reported but the guess is the bar.
    guess = math.log(run.config.data.vocab_size - 1)

    layer0, layer1 = heads[heads.layer == 0], heads[heads.layer == 1]
    prev_head = layer0.loc[layer0.prev_token_score.idxmax()]
    top_induction = layer1.loc[layer1.induction_score.idxmax()]
    induction_heads = layer1[layer1.induction_score > INDUCTION_PATTERN]
    gates_1LH = torch.ones(1, run.model.n_layers, run.model.max_heads)
    gates_1LH[0, 1, induction_heads["head"].tolist()] = 0
    joint = float(run_evaluator(run).evaluate(gates_1LH)["loss"][0]) - repeated if len(induction_heads) else 0.0

    has_prev_head = prev_head.prev_token_score > PREV_TOKEN_PATTERN
    critical = heads[heads.delta_loss > CRITICAL]
    by_pattern = set(map(tuple, induction_heads[["layer", "head"]].to_numpy()))
    if has_prev_head:
        by_pattern.add((0, int(prev_head["head"])))
    explained = [h for h in map(tuple, critical[["layer", "head"]].to_numpy()) if h in by_pattern]
    little = float((heads.delta_loss < CRITICAL).mean())

    def name(row) -> str:
        return head_name(row.layer, row["head"])

    numbers = {
        "first_part_loss": first,
        "context_free_guess_loss": guess,
        "repeated_part_loss": repeated,
        "prev_token_head": name(prev_head),
        "prev_token_head_score": float(prev_head.prev_token_score),
        "prev_token_head_delta": float(prev_head.delta_loss),
        "top_induction_head": name(top_induction),
        "top_induction_head_score": float(top_induction.induction_score),
        "top_induction_head_delta": float(top_induction.delta_loss),
        "induction_heads": [name(row) for _, row in induction_heads.iterrows()],
        "induction_heads_joint_delta": joint,
        "critical_heads": [name(row) for _, row in critical.iterrows()],
        "critical_heads_singled_out_by_patterns": len(explained),
        "share_of_heads_under_1_nat": little,
    }
    single_ok = top_induction.induction_score > INDUCTION_PATTERN and top_induction.delta_loss > CRITICAL
    claims = [
        Claim(
            "The model copies in context: the repeated part's loss is far below the first part's",
            f"repeated part {repeated:.3f} nats against {guess:.2f} for a guess without context (the first part, "
            f"which the model is not trained on, costs {first:.2f})",
            verdict(repeated <= FAR_BELOW * guess),
        ),
        Claim(
            "Ablating the previous-token head in layer 0 raises the repeated-part loss by more than 1 nat",
            f"{name(prev_head)} (previous-token score {prev_head.prev_token_score:.2f}, the highest in layer 0; a "
            f"previous-token head needs > {PREV_TOKEN_PATTERN}): +{prev_head.delta_loss:.2f} nats",
            verdict(has_prev_head and prev_head.delta_loss > CRITICAL),
        ),
        Claim(
            "Ablating the induction head in layer 1 raises the repeated-part loss by more than 1 nat",
            f"{name(top_induction)} (induction score {top_induction.induction_score:.2f}): "
            f"+{top_induction.delta_loss:.2f} nats alone; the {len(induction_heads)} layer-1 heads with induction "
            f"score > {INDUCTION_PATTERN} together: +{joint:.2f} nats",
            verdict(single_ok, partly=len(induction_heads) > 0 and joint > CRITICAL),
        ),
        Claim(
            "A few heads carry the task; most heads matter little",
            f"{len(critical)} of {len(heads)} heads raise the loss by more than 1 nat; {little:.0%} by less",
            verdict(len(critical) >= 1 and little > 0.5),
        ),
        Claim(
            "The heads the ablation singles out are the heads the attention patterns single out",
            f"{len(explained)} of the {len(critical)} heads over 1 nat are layer 0's previous-token head or an "
            f"induction head of layer 1 by pattern",
            verdict(len(critical) > 0 and len(explained) == len(critical), partly=len(explained) > 0),
        ),
    ]
    edges = edge_table(run_dir)
    if edges is not None:
        claim, edge_numbers = composition_claim(edges, name(prev_head), name(top_induction))
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
