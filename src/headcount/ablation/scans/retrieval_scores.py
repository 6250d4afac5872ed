"""`retrieval_scores`: each head's retrieval score (Wu et al. 2024): on a copying task (task=needle), the share of
the copied tokens that the head copies and pastes, i.e. at whose scored position the head's strongest attention lands
on the context token being copied (the task's named position needle<i> for the i-th scored token of a prompt) while
the model's top prediction is that token. Read off the clean model, so the same in every mode and metric. A head's
score is a sum over prompts divided by their copied tokens, so the scan also says how stable its top heads (5%, as
top_heads' "few heads") are over bootstrap resamples of the prompts (circuits/bootstrap.py; summary.json's shared
`intervals` entry, which findings/stability.py reads), and the table has each score's 95% interval over the same
resamples (retrieval_score_ci_low, retrieval_score_ci_high) and top_share (the share of resamples whose top heads hold
the head), from the same forward pass; `_intervals.png` draws the largest scores with their intervals."""

from pathlib import Path

import pandas as pd
import torch
from torch import Tensor

from headcount.ablation.engine.heads import all_heads, head_name
from headcount.ablation.engine.metrics import Targets
from headcount.ablation.scans.base import KINDS, Scan, ScanResult
from headcount.ablation.scans.intervals import interval_figure, top_n
from headcount.circuits.bootstrap import LEVEL, RESAMPLES, percentile_interval, resample_counts, top_n_stability
from headcount.errors import ConfigError
from headcount.model import Transformer
from headcount.model.intervention import reads
from headcount.plotting import head_heatmap

STABILITY_RULE = f"top heads' stability: {RESAMPLES} resamples of prompts; {LEVEL} intervals and top_share"


@KINDS.register
class RetrievalScoresScan(Scan):
    kind = "retrieval_scores"
    ranks_heads = True
    doc = "Wu et al.'s retrieval score: how often a head's strongest attention lands on the token the model copies"
    reads = Scan.reads | {"model", "batches", "positions", "layer_head_tensor"}
    mode_independent = True

    def prepare(self) -> None:
        if "needle0" not in self.session.positions:
            raise ConfigError(
                f"ablation.scans.{self.name}",
                self.kind,
                "needs a copying task whose prompts name "
                "the context token each scored token copies (needle0, needle1, ...): task=needle",
            )

    def compute(self, key: str) -> ScanResult:
        session = self.session
        hits_PK, points_P = retrieval_hits(session.model, session.batches, session.positions)
        layers, heads = (list(x) for x in zip(*all_heads(session.model.heads_per_layer)))
        scores = hits_PK.sum(0) / max(float(points_P.sum()), 1.0)
        table = pd.DataFrame({"layer": layers, "head": heads, "retrieval_score": scores.numpy()})
        table = table.assign(**score_intervals(hits_PK, points_P, session.settings.seed))
        return ScanResult(
            table, summary={"intervals": {self.name: top_stability(hits_PK, points_P, session.settings.seed)}}
        )

    def fingerprint_parts(self) -> tuple:
        """A table computed before the top heads' stability was recorded is computed again, to record it."""
        return (self.kind, STABILITY_RULE)

    def use(self, table: pd.DataFrame) -> None:
        self.session.hand(self.kind, self.session.layer_head_tensor(table, "retrieval_score"))

    def figures(self, table: pd.DataFrame) -> list[Path | None]:
        title = self.title("retrieval score (share of copied tokens a head copies and pastes)")
        heatmap = head_heatmap(table, self.path(".png"), "retrieval_score", title, "retrieval score (fraction)")
        named = table.assign(mask=[head_name(layer, head) for layer, head in zip(table["layer"], table["head"])])
        title = self.title("the largest retrieval scores, with their intervals")
        label = "retrieval score (fraction)"
        return [heatmap, interval_figure(named, self.path(".png", "_intervals"), title, label, "retrieval_score")]

    def file_names(self) -> list[tuple[str, str]]:
        return [*super().file_names(), ("_intervals", ".png")]


def retrieval_hits(model: Transformer, batches: list[dict], positions: list[str]) -> tuple[Tensor, Tensor]:
    """(P, K) float64: for each prompt, how many of its scored tokens each head (all_heads' order) copies and pastes;
    (P,) its scored tokens. A head's retrieval score is the first's column total over the second's total."""
    L, H = model.n_layers, model.max_heads
    per_prompt, points = [], []
    for batch in batches:
        patterns = reads(["attn.pattern"], range(L))
        with torch.no_grad():
            logits_BTV = model(batch["input_ids"], patterns)
        targets = Targets.of(batch)
        b, t = targets.where_BT.nonzero(as_tuple=True)  # row-major: a prompt's points in order
        order = torch.cat([torch.arange(int(n)) for n in targets.where_BT.sum(1)])
        columns = torch.tensor([positions.index(f"needle{i}") for i in order.tolist()], dtype=torch.long)
        source = batch["named_pos"][b, columns]
        copied = logits_BTV[b, t].argmax(-1) == targets.answer_N
        hits_BLH = torch.zeros(batch["input_ids"].shape[0], L, H, dtype=torch.float64)
        for layer in range(L):
            pattern_BHTT = patterns.read("attn.pattern", layer)
            strongest_NH = pattern_BHTT[b, :, t].argmax(-1)
            pasted_NH = ((strongest_NH == source[:, None]) & copied[:, None]).double().cpu()
            hits_BLH[:, layer, : pattern_BHTT.shape[1]].index_add_(0, b.cpu(), pasted_NH)
        per_prompt.append(hits_BLH)
        points.append(targets.where_BT.sum(1).double().cpu())
    layers, heads = (list(x) for x in zip(*all_heads(model.heads_per_layer)))
    return torch.cat(per_prompt)[:, layers, heads], torch.cat(points)


def score_intervals(hits_PK: Tensor, points_P: Tensor, seed: int) -> dict:
    """The table's retrieval_score_ci_low, _ci_high and top_share columns, over the resamples `top_stability` draws
    (the same seed): top_share is each head's share of resamples with it in the top heads (5%, largest first)."""
    counts = resample_counts(len(points_P), RESAMPLES, seed)
    low, high = percentile_interval(hits_PK, points_P, counts, LEVEL)
    shares = top_n_stability(hits_PK, points_P, counts, top_n(hits_PK.shape[1]), magnitude=False)["inclusion"]
    return {"retrieval_score_ci_low": low.numpy(), "retrieval_score_ci_high": high.numpy(), "top_share": shares.numpy()}


def top_stability(hits_PK: Tensor, points_P: Tensor, seed: int) -> dict | str:
    """The top heads' stability entry (findings/stability.py reads it): their share of places kept over resamples;
    why there is none where fewer heads than the top's n copy any token (the rest of that top would be ties at zero,
    which any order keeps: a stability of 100% that says nothing)."""
    n, copying = top_n(hits_PK.shape[1]), int((hits_PK.sum(0) > 0).sum())
    if copying < n:
        return f"{copying} heads copy any token, fewer than the top {n}: the rest of the top would be ties at zero"
    counts = resample_counts(len(points_P), RESAMPLES, seed)
    stability = top_n_stability(hits_PK, points_P, counts, n, magnitude=False)
    entry = {"resamples": RESAMPLES, "by": "retrieval_score", "top_n": n}
    return entry | {k: stability[k] for k in ("mean_overlap", "min_overlap")}
