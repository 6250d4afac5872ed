"""Attribution and gradient importance of an encoder-decoder's heads (ablation/methods/attribution.py's quantities
over its head grid, labels.KindRows), from one forward and one backward pass per batch.

With z' = g z + (1 - g) r, dS/dg = (z - r) . dS/dz' summed over positions, so the attribution A_h = (r - z) . dS/dz'
is -dS/dg_h: the gradient is taken at the gates themselves, one per example (B, L, H), which gives each example's own
dS_b/dg (its metric depends on its own gates only) in the same pass: Michel et al.'s per-example form and the
per-batch form alike. At a mask the gradient is taken at its gates, and heads it has off score 0."""

import torch
from torch import Tensor

from headcount.ablation.engine.metrics import Metric, Targets, point_values
from headcount.ablation.engine.modes import Replacements
from headcount.ablation.engine.seq2seq_evaluator import by_kind, grid_replacements
from headcount.ablation.methods.attribution import Attribution, attribute
from headcount.model.encoder_decoder import EncoderDecoder
from headcount.model.transformer import Transformer


def attribute_heads(
    model: Transformer | EncoderDecoder,
    batches: list[dict[str, Tensor]],
    replacements: Replacements,
    metric: Metric,
    mask_LH: Tensor | None = None,
) -> Attribution:
    """attribute() on a one-stack model, attribute_seq2seq on an encoder-decoder (its heads as one grid of kinds)."""
    if isinstance(model, EncoderDecoder):
        return attribute_seq2seq(model, batches, replacements, metric, mask_LH)
    return attribute(model, batches, replacements, metric, mask_LH)


def attribute_seq2seq(
    model: EncoderDecoder,
    batches: list[dict[str, Tensor]],
    replacements: Replacements,
    metric: Metric,
    mask_LH: Tensor | None = None,
) -> Attribution:
    """attribute()'s Attribution over the grid: (L, H) float64, L the grid's rows."""
    was_training = model.training
    model.eval()
    param = next(model.parameters())
    grid = model.heads_per_layer
    L, H = len(grid), max(grid)
    mask_LH = torch.ones(L, H) if mask_LH is None else mask_LH
    total_LH = torch.zeros(L, H, dtype=torch.float64)
    batch_abs_LH, example_abs_LH = torch.zeros(L, H, dtype=torch.float64), torch.zeros(L, H, dtype=torch.float64)
    n_points = n_batches = n_examples = 0
    examples, points = [], []  # each example's A and points: the units a bootstrap over the prompts resamples
    try:
        for batch in batches:
            with torch.no_grad():
                values = grid_replacements(model, replacements, batch)
            grad_BLH, points_B = gate_gradients(model, batch, values, metric, mask_LH.to(param.device, param.dtype))
            a_BLH = -grad_BLH  # the first-order change of the metric sum when the head goes to its replacement
            examples.append(a_BLH)
            points.append(points_B.cpu())
            total_LH += a_BLH.sum(0)
            if int(points_B.sum()) > 0:
                batch_abs_LH += a_BLH.sum(0).abs() / points_B.sum()
                n_batches += 1
            has_points = points_B > 0
            example_abs_LH += (a_BLH[has_points].abs() / points_B[has_points, None, None]).sum(0)
            n_examples += int(has_points.sum())
            n_points += int(points_B.sum())
    finally:
        model.train(was_training)
    off_LH = (mask_LH == 0).cpu() | ~(torch.arange(H) < torch.tensor(list(grid))[:, None])
    clear = lambda t: t.masked_fill(off_LH, 0.0)  # noqa: E731  heads already off, and slots no row has
    return Attribution(
        clear(total_LH / max(n_points, 1)),
        None,
        clear(batch_abs_LH / max(n_batches, 1)),
        clear(example_abs_LH / max(n_examples, 1)),
        n_points,
        clear(torch.cat(examples)),
        None,
        torch.cat(points),
    )


def gate_gradients(
    model: EncoderDecoder, batch: dict[str, Tensor], values: list | None, metric: Metric, mask_LH: Tensor
) -> tuple[Tensor, Tensor]:
    """(B, L, H) float64 on CPU: dS_b/dg of each example's metric sum at the gates mask_LH, and (B,) its points."""
    targets = Targets.of(batch)
    B = len(batch["input_ids"])
    with torch.enable_grad():
        gates_BLH = mask_LH.expand(B, *mask_LH.shape).clone().requires_grad_(True)
        gates = by_kind(model, gates_BLH)
        replacements = None if values is None else by_kind(model, values)
        memory = model.encode(batch["src_ids"], gates["enc"], (replacements or {}).get("enc"), batch["src_mask"])
        final_BTC = model.decode_stream(
            batch["input_ids"], memory, batch["src_mask"], gates["dec"], gates["cross"], replacements
        )
        total = point_values(model.decoder, final_BTC, targets, metric)[0, :, 0].sum()
        (grad_BLH,) = torch.autograd.grad(total, gates_BLH)
    return grad_BLH.double().cpu(), targets.where_BT.sum(1).cpu()
