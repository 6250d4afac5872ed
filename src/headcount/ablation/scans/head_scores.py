"""`head_scores`: what each head attends to, read off its attention pattern on the eval split (Olsson et al. 2022).

- previous-token score: the mean attention a position pays to the position just before it;
- induction score: the mean attention a position pays to tokens whose *previous* token equals its own token (where an
  induction head looks: "the token after the last time I saw this token"), over positions that have such an earlier
  occurrence.
Both lie in [0, 1]; a head that does the job puts most of its attention there. One heatmap per score. The scores
come from the plain model, so they are the same in every ablation mode: one result, under plain names.

On an encoder-decoder (methods/seq2seq_head_scores.py) each kind gets the scores its attention defines, a row per head
with its `kind`: the encoder's previous- and next-token scores, the decoder's previous-token and induction scores, and
cross-attention's alignment score (the share of attention on the source word that the predicted target word
translates), which needs the generated translation task's alignment (data.source=translation_seq2seq). A score a kind
does not define is NaN in its rows, and summary.json's `not_defined` says why; one figure per score, a panel per kind
that has it.
"""

from math import nan
from pathlib import Path

import pandas as pd
import torch
from omegaconf import DictConfig, OmegaConf

from headcount.ablation.methods.seq2seq_head_scores import KIND_SCORES, NOT_DEFINED, seq2seq_head_scores
from headcount.ablation.methods.seq2seq_head_scores import SCORES as SEQ2SEQ_SCORES
from headcount.ablation.scans.base import KINDS, Scan, ScanResult
from headcount.ablation.scans.by_kind import kind_panels
from headcount.config.data import DataConfig
from headcount.data.translation import MAX_SOURCE, MAX_TARGET, split_pairs, target_alignment
from headcount.model import Transformer
from headcount.model.encoder_decoder import EncoderDecoder
from headcount.model.intervention import reads
from headcount.plotting import head_heatmap

SCORES = ("prev_token_score", "induction_score")


@KINDS.register
class HeadScoresScan(Scan):
    kind = "head_scores"
    doc = "each head's previous-token and induction score (by kind on an encoder-decoder), from its attention pattern"
    reads = Scan.reads | {"model", "batches", "run"}  # run: an encoder-decoder's translation data's alignment
    mode_independent = True

    def compute(self, key: str) -> pd.DataFrame | ScanResult:
        model = self.session.model
        if not isinstance(model, EncoderDecoder):
            return head_pattern_scores(model, self.session.batches)
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

    def figures(self, table: pd.DataFrame) -> list[Path | None]:
        if "kind" in table:  # an encoder-decoder's: per score, a panel per kind that has it
            return [self.kind_figure(table, score) for score in SEQ2SEQ_SCORES]
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
