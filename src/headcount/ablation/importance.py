"""Gradient head importance (Michel, Levy, Neubig 2019): I_{l,h} = E_batches |dL/dg_{l,h}|.

The gates are the model's own head gates (docs/DESIGN.md: z_h <- g z_h + (1 - g) r_h), so the gradient says how fast the
loss moves as a head slides toward its replacement: zero, mean or resample, whichever `replacements` holds.

Michel et al. divide each layer's scores by their l2 norm. A layer of one head would score exactly 1 whatever its
gradient, so layers of one head keep their raw score: with one head per layer, normalised importance is raw
importance, and the pruning order it gives means something. Orders rank by the (normalised) score and break ties by
the raw score (`Importance`).
"""

from typing import NamedTuple

import torch
from torch import Tensor

from headcount.ablation.replacements import Replacements
from headcount.errors import ConfigError
from headcount.metrics import token_nll_and_correct
from headcount.model.transformer import Transformer


class Importance(NamedTuple):
    """Head importance as a pruning order uses it: score_LH ranks the heads, raw_LH (E|dL/dg|) breaks its ties."""

    score_LH: Tensor
    raw_LH: Tensor


def gradient_importance(
    model: Transformer,
    batches: list[dict],
    replacements: list | None = None,
    normalize: bool = True,
    mask_LH: Tensor | None = None,
) -> Tensor:
    """(L, H) importance: the mean over batches of |dL/dg| at g = mask_LH (all ones by default), L each batch's masked
    next-token loss. Heads the mask has switched off (0) score 0, so iterative pruning never picks them twice; heads a
    pruned layer lacks score 0 too. With `normalize`, each layer's row is divided by its l2 norm (Michel et al.),
    except in layers of one head."""
    if not batches:
        raise ConfigError("ablation.n_eval", 0, "gradient importance needs at least one batch")
    param = next(model.parameters())
    shape = (model.n_layers, model.max_heads)
    mask_LH = torch.ones(shape) if mask_LH is None else mask_LH
    gates_LH = mask_LH.detach().to(device=param.device, dtype=param.dtype).clone().requires_grad_(True)
    was_training = model.training
    model.eval()
    try:
        abs_grad_sum_LH = torch.zeros(shape, dtype=param.dtype, device=param.device)
        for batch in batches:
            input_ids_BT = batch["input_ids"].to(param.device)
            logits_BTV = model(input_ids_BT, gates=gates_LH, replacements=replacements)
            nll_BS, _ = token_nll_and_correct(logits_BTV, input_ids_BT)
            marked_BS = batch["loss_mask"][:, 1:].to(device=param.device, dtype=nll_BS.dtype)
            loss = (nll_BS * marked_BS).sum() / marked_BS.sum().clamp_min(1)
            # Gradient with respect to the gates only: parameter .grad fields stay untouched.
            (grad_LH,) = torch.autograd.grad(loss, gates_LH)
            abs_grad_sum_LH += grad_LH.abs()
    finally:
        model.train(was_training)
    importance_LH = (abs_grad_sum_LH / len(batches)).masked_fill(gates_LH.detach() == 0, 0.0)
    return normalize_per_layer(importance_LH, model.heads_per_layer) if normalize else importance_LH


def normalize_per_layer(importance_LH: Tensor, heads_per_layer: list[int]) -> Tensor:
    """Each layer's row divided by its l2 norm, except the rows of layers with one head, which would all become 1."""
    # A layer whose heads are all off has norm 0; its row stays 0 rather than turning into NaN.
    norm_L1 = importance_LH.norm(dim=1, keepdim=True).clamp_min(torch.finfo(importance_LH.dtype).tiny)
    one_head_L1 = torch.tensor(heads_per_layer, device=importance_LH.device).unsqueeze(1) <= 1
    return torch.where(one_head_L1, importance_LH, importance_LH / norm_L1)


def importance_under(
    model: Transformer, batches: list[dict], replacements: Replacements, normalize: bool, mask_LH: Tensor
) -> Importance:
    """Gradient importance at gates mask_LH, with each batch's heads sliding toward `replacements`: the score (per
    layer normalised, if asked) and the raw E|dL/dg| that breaks its ties."""
    if replacements.mode != "resample":
        raw_LH = gradient_importance(model, batches, replacements.for_batch(model, batches[0]), False, mask_LH)
    else:
        # Resample replacements differ per batch, and gradient_importance takes one set: average per-batch calls
        # (the same E_batches |dL/dg|).
        per_batch = []
        for batch in batches:
            with torch.no_grad():
                batch_replacements = replacements.for_batch(model, batch)
            per_batch.append(gradient_importance(model, [batch], batch_replacements, False, mask_LH))
        raw_LH = torch.stack(per_batch).mean(dim=0)
    return Importance(normalize_per_layer(raw_LH, model.heads_per_layer) if normalize else raw_LH, raw_LH)
