"""Gradient head importance (Michel, Levy, Neubig 2019): I_{l,h} = E_batches |dL/dg_{l,h}|.

The gates are the model's own head gates (docs/DESIGN.md: z_h <- g z_h + (1 - g) r_h), so the gradient says how fast the
loss moves as a head slides toward its replacement: zero, mean or resample, whichever `replacements` holds.
"""

import torch
from torch import Tensor

from headcount.ablation.replacements import Replacements
from headcount.errors import ConfigError
from headcount.metrics import token_nll_and_correct
from headcount.model.transformer import Transformer


def gradient_importance(
    model: Transformer,
    batches: list[dict],
    replacements: list | None = None,
    normalize: bool = True,
    mask_LH: Tensor | None = None,
) -> Tensor:
    """(L, H) importance: the mean over batches of |dL/dg| at g = mask_LH (all ones by default), L each batch's masked
    next-token loss. Heads the mask has switched off (0) score 0, so iterative pruning never picks them twice; heads a
    pruned layer lacks score 0 too. With `normalize`, each layer's row is divided by its l2 norm (Michel et al.)."""
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
    if normalize:
        # A layer whose heads are all off has norm 0; its row stays 0 rather than turning into NaN.
        norm_L1 = importance_LH.norm(dim=1, keepdim=True)
        importance_LH = importance_LH / norm_L1.clamp_min(torch.finfo(importance_LH.dtype).tiny)
    return importance_LH


def importance_under(
    model: Transformer, batches: list[dict], replacements: Replacements, normalize: bool, mask_LH: Tensor
) -> Tensor:
    """gradient_importance at gates mask_LH, with each batch's heads sliding toward `replacements`."""
    if replacements.mode != "resample":
        return gradient_importance(model, batches, replacements.for_batch(model, batches[0]), normalize, mask_LH)
    # Resample replacements differ per batch, and gradient_importance takes one set: average per-batch calls
    # (the same E_batches |dL/dg|), then normalise as it would.
    per_batch = []
    for batch in batches:
        with torch.no_grad():
            batch_replacements = replacements.for_batch(model, batch)
        per_batch.append(gradient_importance(model, [batch], batch_replacements, False, mask_LH))
    importance_LH = torch.stack(per_batch).mean(dim=0)
    if not normalize:
        return importance_LH
    return importance_LH / importance_LH.norm(dim=1, keepdim=True).clamp_min(torch.finfo(importance_LH.dtype).tiny)
