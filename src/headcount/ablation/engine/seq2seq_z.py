"""An encoder-decoder's heads' z, in the order of its head grid (labels.KindRows: the encoder's layers, the
decoder's, then its cross-attention layers), and their means: what mean and resample ablation replace a head's z by.

A head's mean z counts the positions that hold a token: the source's (src_mask) for an encoder head, the decoder's
start token and the target's tokens (position 0 and loss_mask) for decoder self-attention and cross-attention heads;
padding never enters a mean (docs/DESIGN.md, "Encoder-decoders")."""

import torch
from torch import Tensor

from headcount.model.encoder_decoder import EncoderDecoder

SITES = {"enc": "enc.blocks.{}.attn.z", "dec": "dec.blocks.{}.attn.z", "cross": "dec.blocks.{}.cross.z"}


def grid_z(model: EncoderDecoder, src_BS: Tensor, src_keep_BS: Tensor, tgt_BT: Tensor) -> list[Tensor]:
    """Every grid row's z on the plain model: (B, S, H, D) for an encoder row, (B, T, H, D) for the others."""
    cache: dict = {}
    model(src_BS, tgt_BT, src_keep=src_keep_BS, cache=cache)
    return [cache[SITES[kind].format(layer)] for kind, layer in model.heads_per_layer.rows]


def decoder_positions(batch: dict[str, Tensor]) -> Tensor:
    """(B, T) bool: the decoder positions that hold a token, its start token and the target's (loss_mask); a task's
    prompt's (valid)."""
    if "valid" in batch:
        return batch["valid"].bool()
    valid_BT = batch["loss_mask"].bool().clone()
    valid_BT[:, 0] = True
    return valid_BT


def grid_positions(model: EncoderDecoder, batch: dict[str, Tensor]) -> list[Tensor]:
    """Per grid row, the (B, S) or (B, T) positions its heads' means count."""
    source_BS, target_BT = batch["src_mask"].bool(), decoder_positions(batch)
    return [source_BS if kind == "enc" else target_BT for kind, _ in model.heads_per_layer.rows]


@torch.no_grad()
def grid_mean_z(model: EncoderDecoder, batches: list[dict[str, Tensor]], per_position: bool) -> list[Tensor]:
    """Each grid row's z averaged over the examples and, unless per_position, the positions that hold a token; summed
    in float64. Per position, positions no example fills keep a zero mean."""
    rows = len(model.heads_per_layer)
    sums: list = [0.0] * rows
    counts: list = [0.0] * rows
    for batch in batches:
        z_rows = grid_z(model, batch["src_ids"], batch["src_mask"], batch["input_ids"])
        for row, (z_BXHD, valid_BX) in enumerate(zip(z_rows, grid_positions(model, batch))):
            sums[row] = sums[row] + (z_BXHD.double() * valid_BX.double()[:, :, None, None]).sum(dim=0)
            counts[row] = counts[row] + valid_BX.double().sum(dim=0)
    dtype = next(model.parameters()).dtype
    if per_position:
        return [(s_XHD / c_X.clamp_min(1)[:, None, None]).to(dtype) for s_XHD, c_X in zip(sums, counts)]
    return [(s_XHD.sum(dim=0) / c_X.sum()).to(dtype) for s_XHD, c_X in zip(sums, counts)]
