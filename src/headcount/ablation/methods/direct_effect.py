"""Each head's direct effect on the metric: its output through W_O at a score point, through the final norm with the
norm's scale taken from the run itself, onto the unembedding direction the metric reads (the correct answer's row
minus the wrong answer's for a logit difference; the correct answer's row otherwise: its direct logit). In a block
that normalises its attention output before adding it (post_norm: Gemma 2/3), a head's output passes that norm too,
its scale frozen at the layer's whole output. With the norms' scales frozen the final stream is a sum of components
(the embedding, each head, each MLP, the biases), so the direct effects of every component add up to the logit read,
exactly; a head's direct effect ignores what it does through later layers (Wang et al. 2022's "direct logit
attribution").

A model that soft-caps its logits (Gemma 2's final_softcap) breaks that sum: the logit read is not linear in the
stream; so do a masked-LM head's transform and post-LN blocks (BERT, BART, Marian, the original Transformer), which
normalise the stream after every addition, so a head's output reaches the logits through every later layer's norm
and is no term of the final stream. `refusal` names each, and the scan refuses it rather than give a number that is
not the head's direct effect. T5 v1.0's scaled unembedding input (unembed_scale) is linear and read in the direction.
An encoder-decoder's decoder heads of both kinds: seq2seq_direct_effect.py."""

import torch
from torch import Tensor, nn

from headcount.ablation.engine.metrics import Metric, Targets
from headcount.ablation.engine.modes import Replacements
from headcount.model.attention import MultiHeadAttention
from headcount.model.encoder_decoder import EncoderDecoder
from headcount.model.intervention import Intervention, gated, reads
from headcount.model.norm import frozen_norm
from headcount.model.transformer import Transformer


def refusal(model: "Transformer | EncoderDecoder") -> str | None:
    """Why direct effects are not exact on this model (its config key named), or None where they are (an
    encoder-decoder's: its decoder's)."""
    stack = model.decoder if isinstance(model, EncoderDecoder) else model
    if stack.lm_head.softcap is not None:
        return f"model.final_softcap={stack.lm_head.softcap}: the soft-capped logits are not linear in the stream"
    if stack.mlm is not None:
        return "model.mlm_head=true: a masked-LM head's transform is not linear in the stream"
    if stack.cfg.post_ln:
        return (
            "model.post_ln=true: the stream is normalised after every addition, so a head's output reaches the logits "
            "through every later norm and is no term of the final stream"
        )
    return None


def unembedding_direction(model: Transformer, targets: Targets, metric: Metric) -> Tensor:
    """(N, C): the row (or difference of rows) of the unembedding the metric reads at each score point, times the
    unembedding input's scale where the model has one (T5 v1.0's d_model^(-1/2), Transformer.readout)."""
    W_VC = model.lm_head.weight
    direction_NC = W_VC[targets.answer_N] - W_VC[targets.wrong_N] if metric.needs_wrong else W_VC[targets.answer_N]
    return direction_NC * model.cfg.d_model**-0.5 if model.cfg.unembed_scale else direction_NC


def head_point_effects(
    attn: MultiHeadAttention, post_norm: nn.Module | None, z_NHD: Tensor, normed, direction_N1C: Tensor
) -> Tensor:
    """(N, H) float64 on CPU: each head's output z_h W_O^h at N score points (through the post-attention norm, its
    scale frozen at the layer's whole output, where the block has one: Gemma 2/3's sandwich), through the final norm
    frozen at the run's stream (`normed`), onto the metric's direction."""
    out_NHC = torch.einsum("nhd,hdc->nhc", z_NHD, attn.W_O)
    if post_norm is not None:
        out_NHC = frozen_norm(post_norm, attn.combine_heads(z_NHD[:, None])[:, 0])(out_NHC)
    return (normed(out_NHC) * direction_N1C).sum(-1).double().cpu()


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
            point_NH = head_point_effects(block.attn, block.ln_attn_out, z_NHD, normed, direction_N1C)
            batch_BLH[:, layer, : z_NHD.shape[1]].index_add_(0, example_N, point_NH)
        sums.append(batch_BLH)
        points.append(targets.where_BT.sum(1).cpu().double())
    return torch.cat(sums), torch.cat(points)
