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

On an encoder-decoder (methods/seq2seq_head_scores.py) each kind gets the scores its attention defines, a row per head
with its `kind`: the encoder's previous- and next-token scores, the decoder's previous-token and induction scores, and
cross-attention's alignment score (the share of attention on the source word that the predicted target word
translates), which needs the generated translation task's alignment (data.source=translation_seq2seq). A score a kind
does not define is NaN in its rows, and summary.json's `not_defined` says why; one figure per score, a panel per kind
that has it. (no intervals there yet).
"""

from math import nan
from pathlib import Path

import pandas as pd
import torch
from omegaconf import DictConfig, OmegaConf
from torch import Tensor

from headcount.ablation.engine.heads import all_heads, head_name
from headcount.ablation.methods.seq2seq_head_scores import KIND_SCORES, NOT_DEFINED, seq2seq_head_scores
from headcount.ablation.methods.seq2seq_head_scores import SCORES as SEQ2SEQ_SCORES
from headcount.ablation.scans.base import KINDS, Scan, ScanResult
from headcount.ablation.scans.by_kind import kind_panels
from headcount.ablation.scans.intervals import interval_figure, score_intervals
from headcount.circuits.bootstrap import LEVEL, RESAMPLES
from headcount.config.data import DataConfig
from headcount.data.translation import MAX_SOURCE, MAX_TARGET, split_pairs, target_alignment
from headcount.model import Transformer
from headcount.model.encoder_decoder import EncoderDecoder
from headcount.model.intervention import reads
from headcount.plotting import head_heatmap

SCORES = ("prev_token_score", "induction_score")
BOOTSTRAP_RULE = f"bootstrap: {RESAMPLES} resamples of examples, {LEVEL} percentile intervals, top 5% by each score"


@KINDS.register
class HeadScoresScan(Scan):
    kind = "head_scores"
    doc = "each head's previous-token and induction score (by kind on an encoder-decoder), from its attention pattern"
    reads = Scan.reads | {"model", "batches", "run"}  # run: an encoder-decoder's translation data's alignment
    mode_independent = True

    def fingerprint_parts(self) -> tuple:
        """A table computed before its intervals is computed again, to have them."""
        return (self.kind, BOOTSTRAP_RULE)

    def compute(self, key: str) -> ScanResult:
        if isinstance(self.session.model, EncoderDecoder):
            return self.compute_by_kind()
        sums = head_pattern_sums(self.session.model, self.session.batches)
        table, entries = scores_table(self.session.model.heads_per_layer), {}
        for score, (contributions_PK, points_P) in sums.items():
            table[score] = (contributions_PK.sum(0) / max(float(points_P.sum()), 1.0)).numpy()
            if not float(points_P.sum()):  # no position to score (no repeated token): no interval either
                none = dict.fromkeys([f"{score}_ci_low", f"{score}_ci_high", f"{score}_top_share"], nan)
                table, entries[score] = table.assign(**none), f"not computed: no example has a position {score} counts"
                continue
            columns, entry = score_intervals(contributions_PK, points_P, score, self.session.settings.seed, False)
            columns[f"{score}_top_share"] = columns.pop("top_share")
            table, entries[score] = table.assign(**columns), entry
        return ScanResult(table, summary={"intervals": {self.name: entries}})

    def compute_by_kind(self) -> ScanResult:
        model = self.session.model
        settings = self.session.settings
        data = self.session.run.config.data
        alignments, missing = translation_alignments(data, settings.split, settings.n_eval, self.session.batches)
        scores = seq2seq_head_scores(model, self.session.batches, alignments)
        table = kind_table(model, scores)
        not_defined = {
            kind: {s: NOT_DEFINED[s] for s in SEQ2SEQ_SCORES if s not in KIND_SCORES[kind]} for kind in scores
        }
        if missing is not None:
            not_defined["cross"]["alignment_score"] = missing
        return ScanResult(table, summary={"not_defined": {self.name: not_defined}})

    def file_names(self) -> list[tuple[str, str]]:
        if isinstance(self.session.model, EncoderDecoder):
            return [("", ".csv"), *((f"_{score}", ".png") for score in SEQ2SEQ_SCORES)]
        return [("", ".csv"), *((f"_{score}", ".png") for score in SCORES), ("_intervals", ".png")]

    def figures(self, table: pd.DataFrame) -> list[Path | None]:
        if "kind" in table:  # an encoder-decoder's: per score, a panel per kind that has it
            return [self.kind_figure(table, score) for score in SEQ2SEQ_SCORES]
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

    def kind_figure(self, table: pd.DataFrame, score: str) -> Path | None:
        scored = table[pd.to_numeric(table[score], errors="coerce").notna()]
        if scored.empty:  # cross-attention's alignment on data without one
            return None
        title = self.title(f"{score.replace('_', ' ')} (share of attention)")
        return kind_panels(scored, self.path(".png", f"_{score}"), score, title, "share of attention (fraction)")


def kind_table(model: EncoderDecoder, scores: dict[str, dict[str, torch.Tensor]]) -> pd.DataFrame:
    """A row per head of every kind (kind, layer, head) with every score, NaN where the kind has none."""
    rows = []
    for kind, per_layer in model.kind_heads_per_layer.items():
        for layer, n_heads in enumerate(per_layer):
            for head in range(n_heads):
                values = {s: float(scores[kind][s][layer, head]) if s in scores[kind] else nan for s in SEQ2SEQ_SCORES}
                rows.append({"kind": kind, "layer": layer, "head": head, **values})
    return pd.DataFrame(rows)


def translation_alignments(
    data_config: DictConfig, split: str, n_eval: int | None, batches: list[dict]
) -> tuple[list[torch.Tensor] | None, str | None]:
    """Per batch, (B, T) the source position aligned with the target word each decoder position predicts (-1: none),
    from the generated translation task's first n_eval pairs of `split` (the same sentences, in the same order, as
    its examples: split_pairs); or None and why, on other data."""
    data = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(DataConfig), data_config))
    if data.source != "translation_seq2seq":
        return None, f"data.source={data.source}: only data.source=translation_seq2seq knows each word's alignment"
    pairs = split_pairs(data, split, n_eval)
    aligned = torch.as_tensor(target_alignment(pairs))
    out, start = [], 0
    for batch in batches:
        B, T = batch["input_ids"].shape
        if not torch.equal(batch["src_ids"][:, :MAX_SOURCE].cpu(), torch.as_tensor(pairs.source[start : start + B])):
            raise RuntimeError("the evaluation batches are not the translation split's pairs in order")
        aligned_BT = torch.full((B, T), -1, dtype=torch.long)
        width = min(T, MAX_TARGET)
        aligned_BT[:, :width] = aligned[start : start + B, :width]  # position t predicts target word t
        out.append(aligned_BT)
        start += B
    return out, None


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
