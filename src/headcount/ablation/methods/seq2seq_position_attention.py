"""An encoder-decoder's attention from a task's scored position (position_attention.py's scan on one stack): the
scored position is in the decoder's stream, so its decoder self-attention heads (`dec`) attend from it to the
stream's positions and its cross-attention heads (`cross`) to the source's. A sequence-to-sequence task names no
positions; what its answer depends on is the tokens its counterpart changes (translation_verb: the source's verb;
translation_agreement: the object's noun in the source, and its determiner, noun and adjectives in the decoder's
stream). Each head's share is the attention the scored position pays to the changed tokens of the sequence it reads
(cross: the source; dec: the decoder's stream), summed over them, averaged over the scored positions of the prompts
that have one. Patterns are seq2seq_head_scores.kind_patterns' (cross-attention recomputed by each layer's own
modules).

An encoder head (`enc`) has no scored position (its queries are the source's tokens): its grid row holds NaN, and a
prompt whose counterpart changes no token a kind reads (translation_verb's decoder streams are the same) adds nothing
to that kind's mean."""

import torch
from torch import Tensor

from headcount.ablation.engine.metrics import Targets
from headcount.ablation.methods.seq2seq_head_scores import kind_patterns
from headcount.model.encoder_decoder import EncoderDecoder

NO_SCORED_POSITION = "an encoder head's queries are the source's tokens: the scored position is in the decoder"
READS = {"dec": "input_ids", "cross": "src_ids"}  # the sequence each kind's keys are positions of


def changed_tokens(clean: dict[str, Tensor], corrupted: dict[str, Tensor]) -> dict[str, Tensor]:
    """{kind: (E, keys) bool}: the tokens the counterpart changes in the sequence each kind attends to. A position
    past one prompt's end and inside the other's may be marked: the scored position pays it no attention (a padded
    source key weighs 0, a later decoder position is masked)."""
    return {kind: clean[key] != corrupted[key] for kind, key in READS.items()}


@torch.no_grad()
def changed_attention_sums(
    model: EncoderDecoder, batches: list[dict[str, Tensor]], changed: dict[str, Tensor]
) -> tuple[Tensor, Tensor]:
    """(E, L, H) float64 over the model's head grid: each example's attention from its scored positions to its
    changed tokens, summed over those positions (NaN on the encoder's rows); and (E, L) the scored positions counted
    for each row (0 where the example changes no token the row's kind reads, and on the encoder's rows). `changed`:
    changed_tokens of the batches' examples, in their order."""
    grid = model.heads_per_layer
    sums, counts, first = [], [], 0
    for batch in batches:
        B = len(batch["input_ids"])
        patterns = kind_patterns(model, batch)
        b, t = Targets.of(batch).where_BT.nonzero(as_tuple=True)
        sums_BLH = torch.zeros(B, len(grid), max(grid), dtype=torch.float64)
        counts_BL = torch.zeros(B, len(grid), dtype=torch.float64)
        sums_BLH[:, grid.kind_rows("enc")] = float("nan")
        for kind in READS:
            on_BK = changed[kind][first : first + B].to(b.device)
            has_N = on_BK[b].any(1)
            for layer, pattern_BHQK in enumerate(patterns[kind]):
                keys_K = pattern_BHQK.shape[-1]
                share_NH = (pattern_BHQK[b, :, t].double() * on_BK[b, None, :keys_K].double()).sum(-1)
                row = grid.row(kind, layer)
                sums_BLH[:, row, : share_NH.shape[1]].index_add_(0, b[has_N].cpu(), share_NH[has_N].cpu())
                counts_BL[:, row].index_add_(0, b[has_N].cpu(), torch.ones(int(has_N.sum()), dtype=torch.float64))
        sums.append(sums_BLH)
        counts.append(counts_BL)
        first += B
    return torch.cat(sums), torch.cat(counts)
