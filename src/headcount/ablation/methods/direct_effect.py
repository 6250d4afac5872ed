"""Each head's direct effect on the metric: its output through W_O at a score point, through the final norm with the
norm's scale taken from the run itself, onto the unembedding direction the metric reads (the correct answer's row
minus the wrong answer's for a logit difference; the correct answer's row otherwise: its direct logit). In a block
that normalises its attention output before adding it (post_norm: Gemma 2/3), a head's output passes that norm too,
its scale frozen at the layer's whole output. With the norms' scales frozen the final stream is a sum of components
(the embedding, each head, each MLP, the biases), so the direct effects of every component add up to the logit read,
exactly; a head's direct effect ignores what it does through later layers (Wang et al. 2022's "direct logit
attribution").

A model that soft-caps its logits (Gemma 2's final_softcap) breaks that sum: the logit read is not linear in the
stream. `refusal` names it, and the scan refuses it rather than give a number that is not the head's direct effect."""

import torch
from torch import Tensor

from headcount.ablation.engine.metrics import Metric, Targets
from headcount.ablation.engine.modes import Replacements
from headcount.model.intervention import Intervention, gated, reads
from headcount.model.norm import frozen_norm
from headcount.model.transformer import Transformer


def refusal(model: Transformer) -> str | None:
    """Why direct effects are not exact on this model (its config key named), or None where they are."""
    if model.lm_head.softcap is not None:
        return f"model.final_softcap={model.lm_head.softcap}: the soft-capped logits are not linear in the stream"
    return None


def unembedding_direction(model: Transformer, targets: Targets, metric: Metric) -> Tensor:
    """(N, C): the row (or difference of rows) of the unembedding the metric reads at each score point."""
    W_VC = model.lm_head.weight
    if metric.needs_wrong:
        return W_VC[targets.answer_N] - W_VC[targets.wrong_N]
    return W_VC[targets.answer_N]


def direct_effects(
    model: Transformer,
    batches: list[dict[str, Tensor]],
    metric: Metric,
    gates_LH: Tensor | None = None,
    replacements: Replacements | None = None,
) -> Tensor:
    """(L, H) float64: each head's direct effect, the mean over the score points; with gates_LH (and the heads' mode
    replacements), on that masked model, the norm's scale its own."""
    sums_ELH, points_E = direct_effect_sums(model, batches, metric, gates_LH, replacements)
    return sums_ELH.sum(0) / max(int(points_E.sum()), 1)


@torch.no_grad()
def direct_effect_sums(
    model: Transformer,
    batches: list[dict[str, Tensor]],
    metric: Metric,
    gates_LH: Tensor | None = None,
    replacements: Replacements | None = None,
) -> tuple[Tensor, Tensor]:
    """(E, L, H) float64: each example's direct effects summed over its score points, and (E,) its points, in the
    batches' example order: the units a bootstrap over the prompts resamples (direct_effects is their ratio)."""
    L, H = model.n_layers, model.max_heads
    sums, points = [], []
    for batch in batches:
        targets = Targets.of(batch)
        values, where = None, None
        if gates_LH is not None and replacements is not None:
            replaced = replacements.for_batch(model, batch)
            values, where = replaced.values, replaced.where_BT
        resid_BTC = model.embed(batch["input_ids"])
        z_sites = reads(["attn.z"], range(L)).cached_sites  # z as the heads pass it on, after any gates
        plain = gates_LH is None
        intervention = Intervention(cache=z_sites) if plain else gated(gates_LH, values, where, cache=z_sites)
        final_BTC = model.forward_layers(resid_BTC, 0, intervention)
        normed = frozen_norm(model.ln_f, final_BTC[targets.where_BT])
        direction_N1C = unembedding_direction(model, targets, metric)[:, None]
        example_N = targets.where_BT.nonzero()[:, 0].cpu()
        batch_BLH = torch.zeros(targets.where_BT.shape[0], L, H, dtype=torch.float64)
        for layer, block in enumerate(model.blocks):
            z_NHD = intervention.read("attn.z", layer)[targets.where_BT]
            out_NHC = torch.einsum("nhd,hdc->nhc", z_NHD, block.attn.W_O)
            if block.ln_attn_out is not None:  # sandwich norms (Gemma 2/3): the attention output is normalised before
                # it is added, its scale frozen at the layer's whole output, as the final norm's is
                out_NHC = frozen_norm(block.ln_attn_out, block.attn.combine_heads(z_NHD[:, None])[:, 0])(out_NHC)
            point_NH = (normed(out_NHC) * direction_N1C).sum(-1).double().cpu()
            batch_BLH[:, layer, : z_NHD.shape[1]].index_add_(0, example_N, point_NH)
        sums.append(batch_BLH)
        points.append(targets.where_BT.sum(1).cpu().double())
    return torch.cat(sums), torch.cat(points)
