"""An encoder-decoder's direct effects, defined as the one-stack model's (direct_effect.py): at each teacher-forced
score point, a head's output through W_O (and through its post-attention norm, where the block has one, its scale
frozen at the layer's whole output), through the decoder's final norm with its scale taken from the run itself, onto
the unembedding direction the metric reads. The decoder's self-attention (`dec`) and cross-attention (`cross`) heads
both add their output to the decoder's residual stream, which the logits read, so each has a direct effect, and with
the norms' scales frozen they add up, with the embedding's, the MLPs' and the biases', to the logit read.

An encoder head (`enc`) has no direct path to the logits: its output reaches them only through the cross-attention
heads that read the encoder's output. Its grid row holds NaN, never a 0 that would read as "no effect"."""

import torch
from torch import Tensor

from headcount.ablation.engine.metrics import Metric, Targets
from headcount.ablation.methods.direct_effect import head_point_effects, unembedding_direction
from headcount.model.encoder_decoder import EncoderDecoder
from headcount.model.intervention import reads
from headcount.model.norm import frozen_norm

NO_DIRECT_PATH = "an encoder head reaches the logits only through cross-attention: it has no direct path to them"
DIRECT_KINDS = ("dec", "cross")  # the kinds whose heads write into the stream the logits read
Z_SITES = {"dec": "attn.z", "cross": "cross.z"}


@torch.no_grad()
def seq2seq_direct_effect_sums(
    model: EncoderDecoder, batches: list[dict[str, Tensor]], metric: Metric
) -> tuple[Tensor, Tensor]:
    """(E, L, H) float64 over the model's head grid (labels.KindRows): each example's direct effects summed over its
    teacher-forced score points, NaN on the encoder's rows; and (E,) its points (direct_effect_sums' units)."""
    grid, decoder = model.heads_per_layer, model.decoder
    sums, points = [], []
    for batch in batches:
        targets, keep_BS = Targets.of(batch), batch.get("src_mask")
        memory_BSC = model.encode(batch["src_ids"], src_keep=keep_BS)
        intervention = reads(Z_SITES.values(), range(decoder.n_layers))  # z as the heads pass it on
        final_BTC = model.run_decoder(batch["input_ids"], memory_BSC, keep_BS, intervention, None)
        normed = frozen_norm(decoder.ln_f, final_BTC[targets.where_BT])
        direction_N1C = unembedding_direction(decoder, targets, metric)[:, None]
        example_N = targets.where_BT.nonzero()[:, 0].cpu()
        batch_BLH = torch.zeros(targets.where_BT.shape[0], len(grid), max(grid), dtype=torch.float64)
        batch_BLH[:, grid.kind_rows("enc")] = float("nan")
        for kind in DIRECT_KINDS:
            for layer, block in enumerate(decoder.blocks):
                attn, post_norm = (
                    (block.attn, block.ln_attn_out) if kind == "dec" else (block.cross, block.ln_cross_out)
                )
                z_NHD = intervention.read(Z_SITES[kind], layer)[targets.where_BT]
                point_NH = head_point_effects(attn, post_norm, z_NHD, normed, direction_N1C)
                batch_BLH[:, grid.row(kind, layer), : z_NHD.shape[1]].index_add_(0, example_N, point_NH)
        sums.append(batch_BLH)
        points.append(targets.where_BT.sum(1).cpu().double())
    return torch.cat(sums), torch.cat(points)
