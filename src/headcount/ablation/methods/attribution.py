"""Attribution patching (Nanda 2023; Kramar et al. 2024): every head's effect on the metric estimated at once, to first
order, from one forward and one backward pass per batch.

Replacing head h's z by r changes the metric sum S over a batch's score points by about
    A_h = sum over examples b and positions t of (r - z)[b, t, h] . dS/dz[b, t, h],
the first-order Taylor term; divided by the evaluation set's score points it estimates the change of the metric (a
mean over points), the `delta` an exact scan measures. r is the mode's replacement (whichever the mode), so
one pass estimates every head in any mode; per named position (a task's IO, S2, ...) the sum runs over that position
alone. The estimate is exact where the metric is linear in z (a one-layer attention-only model without final norm,
read by a logit difference), and tests check that, and the gradient against finite differences.

Michel et al.'s gradient importance is this quantity in zero mode with |.|: with z' = g z + (1 - g) r,
dS/dg = (z - r) . dS/dz', so |A| is |dS/dg| at g = 1. Their paper takes the expectation over examples of |dL_x/dg|
(`example_abs`, L_x the example's mean metric); headcount's earlier per-batch form, |dL_batch/dg| averaged over
batches (`batch_abs`), is kept beside it. At a mask (iterative pruning) the gradient is taken at those gates, and heads
the mask has off score 0.
"""

from dataclasses import dataclass

import torch
from torch import Tensor

from headcount.ablation.engine.metrics import Metric, Targets, point_values
from headcount.ablation.engine.modes import Replacements
from headcount.model.intervention import Intervention, gated, keep, reads
from headcount.model.sites import Site
from headcount.model.transformer import Transformer


@dataclass
class Attribution:
    """Per head (L, H), float64: the estimated change of the metric, and Michel's importance in both forms."""

    estimate_LH: Tensor  # sum of A over the set / its score points: the predicted delta of the metric
    estimate_KLH: Tensor | None  # the same per named position (K positions), when asked
    batch_abs_LH: Tensor  # mean over batches of |A over the batch| / the batch's points
    example_abs_LH: Tensor  # mean over examples with score points of |A over the example| / its points
    n_points: int


def attribute(
    model: Transformer,
    batches: list[dict[str, Tensor]],
    replacements: Replacements,
    metric: Metric,
    mask_LH: Tensor | None = None,
    per_position: bool = False,
) -> Attribution:
    """One forward and backward pass per batch (batches as the evaluator takes them); mask_LH: the gates the
    gradient is taken at (default all ones); per_position: also per named position (batches carry named_pos)."""
    was_training = model.training
    model.eval()
    param = next(model.parameters())
    L, H = model.n_layers, model.max_heads
    total_LH = torch.zeros(L, H, dtype=torch.float64)
    total_KLH = None
    batch_abs_LH, example_abs_LH = torch.zeros(L, H, dtype=torch.float64), torch.zeros(L, H, dtype=torch.float64)
    n_points = n_batches = n_examples = 0
    gates_LH = None if mask_LH is None or bool((mask_LH == 1).all()) else mask_LH.to(param.device, param.dtype)
    try:
        for batch in batches:
            with torch.no_grad():
                replacement = replacements.for_batch(model, batch)
            contribution_BTLH, targets = batch_contributions(model, batch, replacement, metric, gates_LH)
            points_B = targets.where_BT.sum(1)
            per_example_BLH = contribution_BTLH.sum(1)
            total_LH += per_example_BLH.sum(0).cpu()
            if int(points_B.sum()) > 0:
                batch_abs_LH += (per_example_BLH.sum(0).abs() / points_B.sum()).cpu()
                n_batches += 1
            has_points = points_B > 0
            example_abs_LH += (per_example_BLH[has_points].abs() / points_B[has_points, None, None]).sum(0).cpu()
            n_examples += int(has_points.sum())
            n_points += int(points_B.sum())
            if per_position:
                at_KLH = at_named_positions(contribution_BTLH, batch["named_pos"]).cpu()
                total_KLH = at_KLH if total_KLH is None else total_KLH + at_KLH
    finally:
        model.train(was_training)
    off_LH = (mask_LH == 0).cpu() if mask_LH is not None else torch.zeros(L, H, dtype=torch.bool)
    clear = lambda t: t.masked_fill(off_LH, 0.0)  # noqa: E731  heads already off: nothing left to remove
    return Attribution(
        clear(total_LH / max(n_points, 1)),
        None if total_KLH is None else (total_KLH / max(n_points, 1)).masked_fill(off_LH, 0.0),
        clear(batch_abs_LH / max(n_batches, 1)),
        clear(example_abs_LH / max(n_examples, 1)),
        n_points,
    )


def batch_contributions(
    model: Transformer, batch: dict[str, Tensor], replacement, metric: Metric, gates_LH: Tensor | None
) -> tuple[Tensor, Targets]:
    """(B, T, L, H) float64: (r - z) . dS/dz at each position of each head, S the batch's metric sum; and the
    batch's score points."""
    targets = Targets.of(batch)
    L = model.n_layers
    with torch.enable_grad():
        # The stream requires grad, so z does whatever the parameters' flags are (L0 training freezes them).
        resid_BTC = model.embed(batch["input_ids"]).detach().requires_grad_(True)
        before: dict[str, Tensor] = {}  # z before the gates (a hook ahead of them at the same site)
        z_sites = reads(["attn.z"], range(L)).cached_sites
        if gates_LH is None:
            intervention = Intervention(cache=z_sites)
        else:
            keeps = [(site, keep(before)) for site in z_sites]
            intervention = gated(gates_LH, replacement.values, replacement.where_BT, hooks=keeps, cache=z_sites)
        final_BTC = model.forward_layers(resid_BTC, 0, intervention)
        total = point_values(model, final_BTC, targets, metric)[0, :, 0].sum()
        # The gradient at what the heads pass on (the cached z, after any gates): (z - r) . dS/dz' is dS/dg at any
        # gate.
        passed = [intervention.read("attn.z", layer) for layer in range(L)]
        grads = torch.autograd.grad(total, passed, allow_unused=True)
        z = [before.get(Site("attn.z", layer).name, passed[layer]) for layer in range(L)]
    B, T = batch["input_ids"].shape
    out_BTLH = torch.zeros(B, T, model.n_layers, model.max_heads, dtype=torch.float64, device=resid_BTC.device)
    for layer, (z_BTHD, grad_BTHD) in enumerate(zip(z, grads)):
        if grad_BTHD is None:  # a layer the metric does not depend on (no heads)
            continue
        r = None if replacement.values is None else replacement.values[layer]
        delta_BTHD = -z_BTHD.detach() if r is None else r - z_BTHD.detach()
        a_BTH = (delta_BTHD.double() * grad_BTHD.double()).sum(-1)
        if replacement.where_BT is not None:  # positions without a counterpart keep their z: no change
            a_BTH = a_BTH * replacement.where_BT[:, :, None]
        out_BTLH[:, :, layer, : a_BTH.shape[2]] = a_BTH
    return out_BTLH, targets


def at_named_positions(contribution_BTLH: Tensor, named_pos_BK: Tensor) -> Tensor:
    """(K, L, H): the contributions summed over examples at each named position (examples lacking one add nothing)."""
    B, T = contribution_BTLH.shape[:2]
    index_BK = named_pos_BK.clamp_min(0)
    at_BKLH = contribution_BTLH.gather(1, index_BK[:, :, None, None].expand(-1, -1, *contribution_BTLH.shape[2:]))
    return (at_BKLH * (named_pos_BK >= 0)[:, :, None, None]).sum(0)
