"""What each head of an encoder-decoder attends to, read off its attention pattern on the evaluation pairs, a score per
kind where the kind's attention defines it (each in [0, 1], a share of attention; Olsson et al. 2022's scores, the
scan head_scores.py's on a one-stack decoder):

- enc (bidirectional self-attention over the source): previous-token score, the mean attention a source position
  pays to the one before it, and next-token score, to the one after it (Voita et al. 2019's positional heads point
  to either neighbour), over the source positions that have that neighbour;
- dec (causal self-attention over the decoder's stream [start, y_1, ..., y_n]): previous-token score, and induction
  score, the mean attention a position pays to the positions whose previous token equals its own token, over the
  positions that have such an earlier occurrence (as the one-stack scan defines both);
- cross (the decoder's queries over the encoder's output): alignment score, the mean attention the decoder position
  that predicts target word y_{t+1} pays to the source word y_{t+1} translates (a word-aligned attention, as Bahdanau
  et al.'s alignments are read), over the positions whose next word has a source word; it needs that alignment, which
  the generated translation task knows (data/translation.py, target_alignment) and other data does not.

A score a kind's attention does not define is NaN in that kind's rows: induction on the encoder (a bidirectional head
sees every source token, before and after), the neighbour scores on cross-attention (its keys are another sequence's
positions), the next-token score on the causal decoder (it never sees the next token)."""

import torch
from torch import Tensor

from headcount.model.block import Block, CrossInput
from headcount.model.encoder_decoder import EncoderDecoder
from headcount.model.intervention import reads
from headcount.model.transformer import Memory

SCORES = ("prev_token_score", "next_token_score", "induction_score", "alignment_score")
KIND_SCORES = {
    "enc": ("prev_token_score", "next_token_score"),
    "dec": ("prev_token_score", "induction_score"),
    "cross": ("alignment_score",),
}
NOT_DEFINED = {
    "induction_score": "the encoder's attention is bidirectional: a head sees every source token, before and after",
    "next_token_score": "the decoder's self-attention is causal: a head never sees the next token",
    "prev_token_score": "cross-attention's keys are the source's positions, not the decoder's neighbours",
    "alignment_score": "only cross-attention reads the source from the target",
}


@torch.no_grad()
def kind_patterns(model: EncoderDecoder, batch: dict[str, Tensor]) -> dict[str, list[Tensor]]:
    """Each kind's attention patterns, one (B, H, queries, keys) per layer: the encoder's over the source, the
    decoder's self-attention over its stream, and cross-attention's from the decoder's stream over the source (padded
    source keys weigh 0). Cross-attention's are recomputed from the stream into each layer's cross-attention (its
    self-attention's output added to the layer's input) by the layer's own modules and attention arithmetic."""
    keep_BS, decoder = batch.get("src_mask"), model.decoder
    encoder_BLHSS = model.encoder_patterns(batch["src_ids"], keep_BS)
    memory_BSC = model.encode(batch["src_ids"], src_keep=keep_BS)
    seen = reads(("resid_pre", "attn_out", "attn.pattern"), range(decoder.n_layers))
    model.run_decoder(batch["input_ids"], memory_BSC, keep_BS, seen, None)
    cross = decoder.cross_input(Memory(memory_BSC, keep_BS), memory_BSC.dtype)
    cross_patterns = []
    for layer, block in enumerate(decoder.blocks):
        mid_BTC = block.add_attn(seen.read("resid_pre", layer), seen.read("attn_out", layer))
        cross_patterns.append(cross_attention(block, mid_BTC, cross)[1])
    return {
        "enc": list(encoder_BLHSS.unbind(1)),
        "dec": [seen.read("attn.pattern", layer) for layer in range(decoder.n_layers)],
        "cross": cross_patterns,
    }


def cross_attention(block: Block, stream_BTC: Tensor, cross: CrossInput) -> tuple[Tensor, Tensor]:
    """A decoder layer's cross-attention z (B, T, H, D) and pattern (B, H, T, S) from the stream into it: the block's
    own norm, projections and attention arithmetic (Block.add_cross's)."""
    kept = []

    def keep(pattern_BHTS: Tensor) -> Tensor:
        kept.append(pattern_BHTS)
        return pattern_BHTS

    q_BHTD, k_BGSD, v_BGSD = block.cross.project_cross(block.ln_cross(stream_BTC), cross.memory_BSC)
    z_BTHD = block.cross.attend(q_BHTD, k_BGSD, v_BGSD, keep, cross.bias)
    return z_BTHD, kept[0]


def decoder_tokens(batch: dict[str, Tensor]) -> Tensor:
    """(B, T) bool: the decoder's stream positions that hold a token, its start and the target tokens loss_mask
    marks."""
    valid_BT = batch["loss_mask"].bool().clone()
    valid_BT[:, 0] = True
    return valid_BT


def neighbour_sums(pattern_BHQK: Tensor, valid_BQ: Tensor, offset: int) -> tuple[Tensor, int]:
    """(H,) the attention each query pays to the key `offset` away (-1: the previous, +1: the next), summed over the
    queries that hold a token and have a token there; and their count."""
    has_BQ = torch.zeros_like(valid_BQ)
    if offset < 0:
        has_BQ[:, -offset:] = valid_BQ[:, -offset:] & valid_BQ[:, :offset]
    else:
        has_BQ[:, :-offset] = valid_BQ[:, :-offset] & valid_BQ[:, offset:]
    on_BHQ = torch.zeros(pattern_BHQK.shape[:3], dtype=torch.float64, device=pattern_BHQK.device)
    diagonal_BHX = pattern_BHQK.double().diagonal(offset=offset, dim1=-2, dim2=-1)
    if offset < 0:
        on_BHQ[:, :, -offset:] = diagonal_BHX
    else:
        on_BHQ[:, :, :-offset] = diagonal_BHX
    return (on_BHQ * has_BQ[:, None]).sum(dim=(0, 2)).cpu(), int(has_BQ.sum())


def induction_sums(pattern_BHTT: Tensor, ids_BT: Tensor, valid_BT: Tensor) -> tuple[Tensor, int]:
    """(H,) the attention each position pays to the earlier positions whose previous token is its own token, summed
    over the positions that have one; and their count (head_scores.py's induction score's parts)."""
    T = ids_BT.shape[1]
    same_BTS = (ids_BT[:, :, None] == ids_BT[:, None, :]) & valid_BT[:, None, :]
    target_BTS = torch.zeros_like(same_BTS)
    target_BTS[:, :, 1:] = same_BTS[:, :, :-1]
    target_BTS &= torch.ones(T, T, dtype=torch.bool, device=ids_BT.device).tril()
    has_BT = target_BTS.any(dim=-1) & valid_BT
    on_BHT = (pattern_BHTT.double() * target_BTS[:, None].double()).sum(-1)
    return (on_BHT * has_BT[:, None]).sum(dim=(0, 2)).cpu(), int(has_BT.sum())


def alignment_sums(pattern_BHTS: Tensor, aligned_BT: Tensor) -> tuple[Tensor, int]:
    """(H,) the attention each decoder position pays to the source position aligned_BT names (-1: none), summed over
    the positions that have one; and their count."""
    has_BT = aligned_BT >= 0
    at_BHT1 = aligned_BT.clamp_min(0)[:, None, :, None].expand(*pattern_BHTS.shape[:3], 1)
    on_BHT = pattern_BHTS.double().gather(-1, at_BHT1)[..., 0]
    return (on_BHT * has_BT[:, None]).sum(dim=(0, 2)).cpu(), int(has_BT.sum())


def seq2seq_head_scores(
    model: EncoderDecoder, batches: list[dict[str, Tensor]], alignments: list[Tensor] | None = None
) -> dict[str, dict[str, Tensor]]:
    """{kind: {score: (L, H) float64}} over the batches: each kind's scores (KIND_SCORES) per layer and head.
    alignments: per batch, (B, T) the source position aligned with the word each decoder position predicts (-1: none),
    or None (no alignment score: NaN)."""
    model.eval()
    kinds = model.head_kinds
    sums = {kind: {s: torch.zeros(kinds[kind], dtype=torch.float64) for s in KIND_SCORES[kind]} for kind in kinds}
    counts = {kind: dict.fromkeys(KIND_SCORES[kind], 0) for kind in kinds}

    def add(kind: str, score: str, layer: int, part: tuple[Tensor, int]) -> None:
        sums[kind][score][layer, : len(part[0])] += part[0]
        counts[kind][score] += part[1] if layer == 0 else 0  # each layer sees the same positions: count them once

    for index, batch in enumerate(batches):
        patterns = kind_patterns(model, batch)
        source_BS = batch["src_mask"].bool() if "src_mask" in batch else torch.ones_like(batch["src_ids"]).bool()
        target_BT = decoder_tokens(batch)
        for layer, pattern in enumerate(patterns["enc"]):
            add("enc", "prev_token_score", layer, neighbour_sums(pattern, source_BS, -1))
            add("enc", "next_token_score", layer, neighbour_sums(pattern, source_BS, 1))
        for layer, pattern in enumerate(patterns["dec"]):
            add("dec", "prev_token_score", layer, neighbour_sums(pattern, target_BT, -1))
            add("dec", "induction_score", layer, induction_sums(pattern, batch["input_ids"], target_BT))
        if alignments is not None:
            for layer, pattern in enumerate(patterns["cross"]):
                add("cross", "alignment_score", layer, alignment_sums(pattern, alignments[index].to(pattern.device)))
    return {
        kind: {
            score: sums[kind][score] / counts[kind][score]
            if counts[kind][score]
            else torch.full(kinds[kind], torch.nan, dtype=torch.float64)
            for score in KIND_SCORES[kind]
        }
        for kind in kinds
    }
