"""Gradient head importance (Michel, Levy, Neubig 2019): I_{l,h} = E |dL/dg_{l,h}|, from the attribution pass.

The gates are the model's own head gates (docs/DESIGN.md: z_h <- g z_h + (1 - g) r_h), so the gradient says how fast the
metric moves as a head slides toward its replacement, the mode's, whichever `replacements` holds. It
is attribution patching with |.| (ablation/methods/attribution.py, one implementation): the expectation runs over
batches (|dL_batch/dg| averaged over batches, headcount's form before) or, as the paper defines it, over examples
(`per_example=True`: |dL_x/dg| averaged over examples).

Michel et al. divide each layer's scores by their l2 norm. A layer of one head would score exactly 1 whatever its
gradient, so layers of one head keep their raw score: with one head per layer, normalised importance is raw
importance, and the pruning order it gives means something. Orders rank by the (normalised) score and break ties by
the raw score (`Importance`).
"""

from typing import NamedTuple

import torch
from torch import Tensor

from headcount.ablation.engine.metrics import Loss, Metric
from headcount.ablation.engine.modes import Mean, Replacements, Zero
from headcount.ablation.methods.seq2seq_attribution import attribute_heads
from headcount.errors import ConfigError
from headcount.model.transformer import Transformer


class Importance(NamedTuple):
    """Head importance as a pruning order uses it: score_LH ranks the heads, raw_LH (E|dL/dg|) breaks its ties."""

    score_LH: Tensor
    raw_LH: Tensor


def importance_under(
    model: Transformer,
    batches: list[dict],
    replacements: Replacements,
    normalize: bool,
    mask_LH: Tensor | None = None,
    metric: Metric | None = None,
    per_example: bool = False,
) -> Importance:
    """Gradient importance at gates mask_LH (all ones by default), each head sliding toward `replacements`: the
    score (per layer normalised, if asked) and the raw E|dL/dg| that breaks its ties. Heads the mask has off (0),
    and heads a pruned layer lacks, score 0."""
    if not batches:
        raise ConfigError("ablation.n_eval", 0, "gradient importance needs at least one batch")
    attribution = attribute_heads(model, batches, replacements, metric or Loss(), mask_LH)
    raw_LH = attribution.example_abs_LH if per_example else attribution.batch_abs_LH
    dtype = next(model.parameters()).dtype
    raw_LH = raw_LH.to(device=next(model.parameters()).device, dtype=dtype)
    return Importance(normalize_per_layer(raw_LH, model.heads_per_layer) if normalize else raw_LH, raw_LH)


def gradient_importance(
    model: Transformer,
    batches: list[dict],
    replacements: list[Tensor] | None = None,
    normalize: bool = True,
    mask_LH: Tensor | None = None,
    per_example: bool = False,
) -> Tensor:
    """(L, H) the next-token loss's gradient importance at gates mask_LH, with a constant replacement per layer
    (`replacements`, as Transformer.forward takes them; None: zero ablation)."""
    prepared = Replacements(Zero()) if replacements is None else Replacements(Mean(), list(replacements))
    return importance_under(model, batches, prepared, normalize, mask_LH, per_example=per_example).score_LH


def normalize_per_layer(importance_LH: Tensor, heads_per_layer: list[int]) -> Tensor:
    """Each layer's row divided by its l2 norm, except the rows of layers with one head, which would all become 1."""
    # A layer whose heads are all off has norm 0; its row stays 0 rather than turning into NaN.
    norm_L1 = importance_LH.norm(dim=1, keepdim=True).clamp_min(torch.finfo(importance_LH.dtype).tiny)
    one_head_L1 = torch.tensor(heads_per_layer, device=importance_LH.device).unsqueeze(1) <= 1
    return torch.where(one_head_L1, importance_LH, importance_LH / norm_L1)
