"""`head_scores`: what each head attends to, read off its attention pattern on the eval split (Olsson et al. 2022).

- previous-token score: the mean attention a position pays to the position just before it;
- induction score: the mean attention a position pays to tokens whose *previous* token equals its own token (where an
  induction head looks: "the token after the last time I saw this token"), over positions that have such an earlier
  occurrence.
Both lie in [0, 1]; a head that does the job puts most of its attention there. One heatmap per score. The scores
come from the plain model, so they are the same in every ablation mode: one result, under plain names.

Each score is a sum over the examples (a task's prompts, the sequences of the run's data) of their attention on the
target divided by their counted positions, so the table also has each score's 95% bootstrap interval over the
examples (<score>_ci_low, <score>_ci_high; 1000 resamples seeded by `ablation.seed`, circuits/bootstrap.py) and
<score>_top_share, the share of resamples whose top 5% of heads by the score hold the head; summary.json's
`intervals.<name>` has, per score, the stability of that top (mean_overlap, min_overlap). Kept from the same forward
pass as the scores: no extra pass. `_intervals.png` draws the heads of largest induction score with both intervals.
"""

from pathlib import Path

import pandas as pd
import torch
from torch import Tensor

from headcount.ablation.engine.heads import all_heads, head_name
from headcount.ablation.scans.base import KINDS, Scan, ScanResult
from headcount.ablation.scans.intervals import interval_figure, score_intervals
from headcount.circuits.bootstrap import LEVEL, RESAMPLES
from headcount.model import Transformer
from headcount.model.intervention import reads
from headcount.plotting import head_heatmap

SCORES = ("prev_token_score", "induction_score")
BOOTSTRAP_RULE = f"bootstrap: {RESAMPLES} resamples of examples, {LEVEL} percentile intervals, top 5% by each score"


@KINDS.register
class HeadScoresScan(Scan):
    kind = "head_scores"
    doc = "each head's previous-token and induction score, from its attention pattern"
    reads = Scan.reads | {"model", "batches"}
    mode_independent = True

    def fingerprint_parts(self) -> tuple:
        """A table computed before its intervals is computed again, to have them."""
        return (self.kind, BOOTSTRAP_RULE)

    def compute(self, key: str) -> ScanResult:
        sums = head_pattern_sums(self.session.model, self.session.batches)
        table, entries = scores_table(self.session.model.heads_per_layer), {}
        for score, (contributions_PK, points_P) in sums.items():
            table[score] = (contributions_PK.sum(0) / max(float(points_P.sum()), 1.0)).numpy()
            if not float(points_P.sum()):  # no position to score (no repeated token): no interval either
                nan = dict.fromkeys([f"{score}_ci_low", f"{score}_ci_high", f"{score}_top_share"], float("nan"))
                table, entries[score] = table.assign(**nan), f"not computed: no example has a position {score} counts"
                continue
            columns, entry = score_intervals(contributions_PK, points_P, score, self.session.settings.seed, False)
            columns[f"{score}_top_share"] = columns.pop("top_share")
            table, entries[score] = table.assign(**columns), entry
        return ScanResult(table, summary={"intervals": {self.name: entries}})

    def file_names(self) -> list[tuple[str, str]]:
        return [("", ".csv"), *((f"_{score}", ".png") for score in SCORES), ("_intervals", ".png")]

    def figures(self, table: pd.DataFrame) -> list[Path | None]:
        heatmaps = [
            head_heatmap(
                table,
                self.path(".png", f"_{score}"),
                score,
                self.title(f"{score.replace('_', ' ')} (share of attention)"),
                "share of attention (fraction)",
            )
            for score in SCORES
        ]
        named = table.assign(mask=[head_name(layer, head) for layer, head in zip(table["layer"], table["head"])])
        title = self.title("the heads of largest induction score, with both scores' intervals")
        beside = ("prev_token_score", "previous-token score")
        path = self.path(".png", "_intervals")
        return [*heatmaps, interval_figure(named, path, title, "induction score", "induction_score", beside=beside)]


def scores_table(heads_per_layer: list[int]) -> pd.DataFrame:
    layers, heads = (list(x) for x in zip(*all_heads(heads_per_layer)))
    return pd.DataFrame({"layer": layers, "head": heads})


@torch.no_grad()
def head_pattern_sums(model: Transformer, batches: list[dict]) -> dict[str, tuple[Tensor, Tensor]]:
    """score -> ((P, K) each example's attention on the score's targets summed over its counted positions, per head
    in all_heads' order; (P,) its counted positions): a head's score is the first's column total over the second's
    total, and a bootstrap resample's score the same totals weighted by how often it draws each example."""
    model.eval()
    device = next(model.parameters()).device
    L, H = model.n_layers, model.max_heads
    prev_PLH, induction_PLH, prev_P, induction_P = [], [], [], []
    for batch in batches:
        ids_BT = batch["input_ids"].to(device)
        patterns = reads(["attn.pattern"], range(L))
        model(ids_BT, patterns)
        B, T = ids_BT.shape
        # Positions inside an example: a task's prompts are padded, and padding says nothing about a head.
        valid_BT = batch.get("valid", torch.ones(B, T, dtype=torch.bool)).to(device)
        # induction_BTS[b, t, s]: the token before s equals the token at t, s <= t.
        same_BTS = ids_BT[:, :, None] == ids_BT[:, None, :]
        induction_BTS = torch.zeros_like(same_BTS)
        induction_BTS[:, :, 1:] = same_BTS[:, :, :-1]
        induction_BTS &= torch.ones(T, T, dtype=torch.bool, device=device).tril()
        has_earlier_BT = induction_BTS.any(dim=-1) & valid_BT
        induction_P.append(has_earlier_BT.sum(1).double().cpu())
        prev_P.append(valid_BT[:, 1:].sum(1).double().cpu())
        prev_BLH, induction_BLH = torch.zeros(2, B, L, H, dtype=torch.float64)
        for layer in range(L):
            pattern_BHTT = patterns.read("attn.pattern", layer).double()
            h = pattern_BHTT.shape[1]
            previous_BHT = pattern_BHTT.diagonal(offset=-1, dim1=-2, dim2=-1) * valid_BT[:, None, 1:]
            prev_BLH[:, layer, :h] = previous_BHT.sum(2).cpu()
            on_target_BHT = (pattern_BHTT * induction_BTS[:, None].double()).sum(-1)
            induction_BLH[:, layer, :h] = (on_target_BHT * has_earlier_BT[:, None]).sum(2).cpu()
        prev_PLH.append(prev_BLH)
        induction_PLH.append(induction_BLH)
    layers, heads = (list(x) for x in zip(*all_heads(model.heads_per_layer)))
    return {
        "prev_token_score": (torch.cat(prev_PLH)[:, layers, heads], torch.cat(prev_P)),
        "induction_score": (torch.cat(induction_PLH)[:, layers, heads], torch.cat(induction_P)),
    }


def head_pattern_scores(model: Transformer, batches: list[dict]) -> pd.DataFrame:
    """One row per head: layer, head, prev_token_score, induction_score."""
    table = scores_table(model.heads_per_layer)
    for score, (contributions_PK, points_P) in head_pattern_sums(model, batches).items():
        table[score] = (contributions_PK.sum(0) / max(float(points_P.sum()), 1.0)).numpy()
    return table
