"""Retrieval heads on a real model (experiment retrieval_heads: SmolLM2-135M, task=needle, zero ablation, copying
accuracy), after Wu et al. 2024, "Retrieval head mechanistically explains long-context factuality":

(0) the model does the task: it copies the passphrase back (token accuracy, teacher-forced, at least 80%);
(1) retrieval heads are sparse: fewer than 5% of heads have a retrieval score above 0.1;
(2) they are needed: zeroing the top retrieval heads (5% of heads) cuts needle accuracy by more than half, while as
    many random heads (several draws) cut it by less than a tenth; "reproduced" only where that top is stable over
    bootstrap resamples of the prompts (the retrieval_scores scan's `intervals` entry; findings/stability.py);
(3) how they relate to induction heads (Olsson et al. 2022): the heads whose induction score on repeated random
    tokens passes 0.3 (found as the pretrained_heads experiment finds them) against the retrieval heads, overlap and
    counts. Our reading, not Wu et al.'s claim: both copy from the context, so most retrieval heads should be
    induction heads; reproduced when at least half are.

Each claim's verdict is a function of plain tables and numbers (the *_claim functions), tested on made-up ones.
"""

from pathlib import Path

import pandas as pd

from headcount.ablation.engine.heads import head_name
from headcount.ablation.records.results import read_checked
from headcount.ablation.records.summary import SHARED, read_summary, summary_beside
from headcount.ablation.scans.top_heads import top_and_random
from headcount.findings.claims import FINDINGS, Claim, Finding, FindingChecker, verdict
from headcount.findings.copying import copying_probe, repeated_random_batches
from headcount.findings.induction import INDUCTION_PATTERN
from headcount.findings.run_data import scan_file, scan_results
from headcount.findings.sixteen_heads import copied
from headcount.findings.stability import ranking_stability
from headcount.run_dir import load_run

PAPER = "Wu et al. 2024, Retrieval head mechanistically explains long-context factuality"
DOES_TASK = 0.8  # (0) token accuracy on the passphrase
RETRIEVAL = 0.1  # (1) a retrieval head's score
SPARSE = 0.05  # (1) under this share of all heads
HALF, TENTH = 0.5, 0.1  # (2)
PROBE_SEQUENCES, PROBE_HALF = 16, 64  # (3) the repeated random tokens the induction scores are read on


def check(run_dir: Path, out: Path) -> Finding:
    summary, (top,) = scan_results(run_dir, ["top_heads"])
    scores_csv = scan_file(run_dir, "retrieval_scores", ".csv", mode_independent=True)
    scores = read_checked(scores_csv)
    shared = read_summary(summary_beside(scores_csv)).get(SHARED, {})
    run = load_run(run_dir)
    a = run.config.ablation
    batches = repeated_random_batches(run.model.cfg.vocab_size, PROBE_SEQUENCES, PROBE_HALF, a.batch_size, a.seed)
    induction = copying_probe(run.model, batches, 1, 0, a.seed).heads
    accuracy = summary["baseline_acc"]
    results = [
        task_claim(accuracy),
        sparse_claim(scores),
        needed_claim(top, accuracy, shared.get("intervals", {}).get("retrieval_scores")),
        induction_claim(scores, induction),
    ]
    numbers = {"needle_accuracy": accuracy, "n_heads": len(scores)}
    for _, claim_numbers in results:
        numbers.update(claim_numbers)
    cited = [
        scan_file(run_dir, "retrieval_scores", ".png", mode_independent=True),
        scan_file(run_dir, "top_heads", ".png"),
    ]
    return Finding("retrieval_heads", PAPER, [claim for claim, _ in results], numbers, copied(cited, out))


def task_claim(accuracy: float) -> tuple[Claim, dict]:
    claim = Claim(
        f"(0) The model copies the passphrase back from the context (token accuracy at least {DOES_TASK:.0%})",
        f"token accuracy {accuracy:.1%} on the passphrases (teacher-forced, every word scored)",
        verdict(accuracy >= DOES_TASK, accuracy >= DOES_TASK / 2),
    )
    return claim, {}


def retrieval_heads(scores: pd.DataFrame) -> pd.DataFrame:
    return scores[scores["retrieval_score"] > RETRIEVAL]


def sparse_claim(scores: pd.DataFrame) -> tuple[Claim, dict]:
    found = retrieval_heads(scores)
    share = len(found) / len(scores)
    names = ", ".join(f"{head_name(r.layer, r.head)} {r.retrieval_score:.2f}" for r in found.itertuples())
    claim = Claim(
        f"(1) Retrieval heads are sparse: fewer than {SPARSE:.0%} of heads have a retrieval score above {RETRIEVAL:g}",
        f"{len(found)} of {len(scores)} heads ({share:.1%})"
        + (f": {names}" if names else "")
        + f"; the highest score {scores['retrieval_score'].max():.2f}",
        verdict(0 < share < SPARSE, share < 2 * SPARSE),
    )
    return claim, {"retrieval_heads": len(found), "retrieval_heads_share": share}


def needed_claim(top: pd.DataFrame, accuracy: float, stability: dict | str | None = None) -> tuple[Claim, dict]:
    """stability: the retrieval_scores scan's `intervals` entry (how often its top heads stay on top over resamples of
    the prompts); "reproduced" only where that top is stable (findings/stability.py)."""
    best, random_sets = top_and_random(top)
    random = random_sets["acc"]
    cut = (accuracy - float(best["acc"])) / accuracy if accuracy else 0.0
    random_cuts = (accuracy - random) / accuracy if accuracy else random * 0
    n = int(best["n_heads_off"])
    holds = [cut > HALF, bool(len(random)) and float(random_cuts.max()) < TENTH]
    measured = (
        f"zeroing the top {n} heads by retrieval score cuts the accuracy from {accuracy:.1%} to {best['acc']:.1%} "
        f"({cut:.0%} of it); {len(random)} random sets of {n} cut it by {float(random_cuts.min()):.0%} to "
        f"{float(random_cuts.max()):.0%}"
    )
    claim = Claim(
        f"(2) Retrieval heads are needed: zeroing the top 5% cuts needle accuracy by more than {HALF:.0%}, as many "
        f"random heads by less than {TENTH:.0%}",
        measured,
        verdict(all(holds), any(holds)),
    )
    claim, stable = ranking_stability(claim, stability, "heads by retrieval score", "top_heads_bootstrap_overlap")
    return claim, {"top_heads_accuracy_cut": cut, "random_heads_accuracy_cut_max": float(random_cuts.max())} | stable


def induction_claim(scores: pd.DataFrame, induction: pd.DataFrame) -> tuple[Claim, dict]:
    heads = scores.merge(induction[["layer", "head", "induction_score"]], on=["layer", "head"])
    retrieval = heads["retrieval_score"] > RETRIEVAL
    inductive = heads["induction_score"] > INDUCTION_PATTERN
    both = int((retrieval & inductive).sum())
    n_retrieval, n_induction = int(retrieval.sum()), int(inductive.sum())
    share = both / n_retrieval if n_retrieval else 0.0
    corr = float(heads["retrieval_score"].rank().corr(heads["induction_score"].rank()))
    claim = Claim(
        "(3) Retrieval heads are induction heads (our reading): most heads with a retrieval score above "
        f"{RETRIEVAL:g} have an induction score above {INDUCTION_PATTERN:g} on repeated random tokens",
        f"{n_retrieval} retrieval heads, {n_induction} induction heads, {both} both ({share:.0%} of the retrieval "
        f"heads, {both / n_induction if n_induction else 0:.0%} of the induction heads); Spearman {corr:.2f} between "
        "the two scores over all heads",
        verdict(n_retrieval > 0 and share >= 0.5, both > 0),
    )
    return claim, {"induction_heads": n_induction, "retrieval_and_induction": both, "score_spearman": corr}


FINDINGS.register(
    FindingChecker(
        "retrieval_heads",
        check,
        "run",
        ("retrieval_scores", "top_heads"),
        "Wu et al. 2024: retrieval heads copy from context",
    )
)
