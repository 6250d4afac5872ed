"""`head_scores`: what each head attends to, read off its attention pattern on the eval split (Olsson et al. 2022).

- previous-token score: the mean attention a position pays to the position just before it;
- induction score: the mean attention a position pays to tokens whose *previous* token equals its own token (where an
  induction head looks: "the token after the last time I saw this token"), over positions that have such an earlier
  occurrence.
Both lie in [0, 1]; a head that does the job puts most of its attention there. One heatmap per score. The scores
come from the plain model, so they are the same in every ablation mode: one result, under plain names.
"""

from pathlib import Path

import pandas as pd
import torch

from headcount.ablation.scans.base import KINDS, Scan
from headcount.model import Transformer
from headcount.model.intervention import reads
from headcount.plotting import head_heatmap

SCORES = ("prev_token_score", "induction_score")


@KINDS.register
class HeadScoresScan(Scan):
    kind = "head_scores"
    doc = "each head's previous-token and induction score, from its attention pattern"
    reads = Scan.reads | {"model", "batches"}
    mode_independent = True

    def compute(self, key: str) -> pd.DataFrame:
        return head_pattern_scores(self.session.model, self.session.batches)

    def figures(self, table: pd.DataFrame) -> list[Path | None]:
        return [
            head_heatmap(
                table,
                self.path(".png", f"_{score}"),
                score,
                self.title(f"{score.replace('_', ' ')} (share of attention)"),
                "share of attention (fraction)",
            )
            for score in SCORES
        ]


@torch.no_grad()
def head_pattern_scores(model: Transformer, batches: list[dict]) -> pd.DataFrame:
    """One row per head: layer, head, prev_token_score, induction_score."""
    model.eval()
    device = next(model.parameters()).device
    L, H = model.n_layers, model.max_heads
    prev_sum, induction_sum = torch.zeros(L, H, dtype=torch.float64), torch.zeros(L, H, dtype=torch.float64)
    prev_count = induction_count = 0
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
        induction_count += int(has_earlier_BT.sum())
        prev_count += int(valid_BT[:, 1:].sum())
        for layer in range(L):
            pattern_BHTT = patterns.read("attn.pattern", layer).double()
            h = pattern_BHTT.shape[1]
            previous_BHT = pattern_BHTT.diagonal(offset=-1, dim1=-2, dim2=-1) * valid_BT[:, None, 1:]
            prev_sum[layer, :h] += previous_BHT.sum(dim=(0, 2)).cpu()
            on_target_BHT = (pattern_BHTT * induction_BTS[:, None].double()).sum(-1)
            induction_sum[layer, :h] += (on_target_BHT * has_earlier_BT[:, None]).sum(dim=(0, 2)).cpu()
    rows = [
        {
            "layer": layer,
            "head": head,
            "prev_token_score": float(prev_sum[layer, head] / max(prev_count, 1)),
            "induction_score": float(induction_sum[layer, head] / max(induction_count, 1)),
        }
        for layer in range(L)
        for head in range(model.heads_per_layer[layer])
    ]
    return pd.DataFrame(rows)
