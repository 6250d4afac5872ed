"""Structural export (ablation.prune.export): which heads to remove (exactly ablation.prune.heads, the mask the l0_gates
scan learned, or what a pruning order removes at a given or its prunable fraction), the smaller checkpoint
ablation/pruned.ckpt without them, and how much faster it runs than the full model."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

from headcount.ablation.context import ScanContext
from headcount.ablation.evaluator import MaskEvaluator
from headcount.ablation.masks import HeadMask, check_head_exists, masks_to_gates
from headcount.ablation.scans.l0_gates import l0_keep_gates
from headcount.ablation.scans.pruning import prunable_fraction
from headcount.ablation.scans.single_head import single_head_delta
from headcount.config.ablation import PruneExportConfig, PruningConfig
from headcount.errors import ConfigError
from headcount.model.transformer import Transformer

SPEED_REPEATS = 5


def check_prune_heads(prune: PruneExportConfig, heads_per_layer: list[int]) -> None:
    for pair in prune.heads or []:
        if not (isinstance(pair, list) and len(pair) == 2):
            raise ConfigError("ablation.prune.heads", pair, "each entry must be a [layer, head] pair")
        check_head_exists(*pair, heads_per_layer, "ablation.prune.heads")


def export_pruned_model(session: ScanContext) -> None:
    """Write ablation/pruned.ckpt without the heads the settings choose, and record it in summary.json."""
    s, prune, hpl = session.settings, session.settings.prune, session.heads_per_layer
    if prune.heads is not None:
        chosen = HeadMask("ablation.prune.heads", tuple(tuple(pair) for pair in prune.heads))
        keep_LH = masks_to_gates([chosen], hpl)[0]
        meta = {"chosen_by": "ablation.prune.heads"}
    elif prune.order == "l0_gates":
        keep_LH = l0_keep_gates(session, prune.l0_target_heads)
        meta = {"chosen_by": "l0_gates", "order": "l0_gates", "target_heads": prune.l0_target_heads}
    else:
        fraction = prune.fraction if prune.fraction is not None else prunable_fraction(session, prune.order)
        delta = lambda: single_head_delta(session)  # noqa: E731
        keep_LH = removal_gates(prune.order, fraction, hpl, s.pruning, s.seed, session.importance, delta)
        meta = {"chosen_by": f"pruning order {prune.order}", "order": prune.order, "fraction": fraction}
    path = session.out / "pruned.ckpt"
    means = session.replacements.means if s.mode == "mean" else None
    speed_shape = (s.batch_size, session.batches[0]["input_ids"].shape[1])
    evaluator, model = session.evaluator, session.model
    record = export_pruned(model, evaluator, keep_LH, means, path, {**meta, "mode": s.mode}, speed_shape)
    session.files.written.append(path)
    session.files.update_summary({"pruned": record})


def removal_gates(
    order: str,
    fraction: float,
    heads_per_layer: list[int],
    cfg: PruningConfig,
    seed: int,
    importance_fn: Callable[[Tensor], Tensor],
    single_head_delta: Callable[[], Tensor],
) -> Tensor:
    """(L, H) keep-gates removing round(fraction * heads) heads the way that order's pruning curve does at that
    fraction (random: the first of its seeds)."""
    from headcount.ablation.pruning import (
        existing_heads,
        iterative_masks,
        masks_removing_first,
        random_ranking,
        rank_ascending,
        step_fractions,
    )

    exists_LH = existing_heads(heads_per_layer)
    total = int(exists_LH.sum())
    n_pruned = round(fraction * total)
    if order == "gradient_iterative":
        # The same steps as the curve up to this count, so the mask matches the curve's at a grid fraction.
        steps = {count for count in (round(f * total) for f in step_fractions(cfg.step)) if count < n_pruned}
        return iterative_masks(importance_fn, sorted(steps | {n_pruned}), exists_LH)[-1]
    if order == "gradient":
        ranking = rank_ascending(importance_fn(torch.ones(exists_LH.shape)), exists_LH)
    elif order == "single_head":
        ranking = rank_ascending(single_head_delta(), exists_LH)
    else:
        ranking = random_ranking(exists_LH, seed * cfg.random_seeds)
    return masks_removing_first(ranking, [n_pruned], exists_LH)[0]


def export_pruned(
    model: Transformer,
    evaluator: MaskEvaluator,
    keep_LH: Tensor,
    replacements: list[Tensor] | None,
    path: Path,
    meta: dict,
    speed_shape: tuple[int, int],
) -> dict:
    """Write the model without the heads keep_LH switches off; return what summary.json records about it: the masked
    and the pruned model's loss (equal, up to rounding) and their forward throughput on speed_shape (B, T) batches."""
    from headcount.ablation.structural import measure_speed, prune_heads, save_pruned_checkpoint

    exists_LH = evaluator.exists_LH.cpu()
    remove_LH = (keep_LH.cpu() == 0) & exists_LH
    pruned = prune_heads(model, remove_LH, replacements)
    masked_loss = float(evaluator.evaluate(keep_LH[None])["loss"][0])
    pruned_loss = MaskEvaluator(pruned, evaluator.batches).baseline()["loss"]
    heads_removed = remove_LH.nonzero().tolist()
    record = {
        **meta,
        "path": path.name,
        "heads_removed": heads_removed,
        "n_heads_removed": len(heads_removed),
        "heads_per_layer": list(pruned.heads_per_layer),
        "params_full": model.num_params(),
        "params_pruned": pruned.num_params(),
        "loss_masked": masked_loss,
        "loss_pruned": pruned_loss,
    }
    save_pruned_checkpoint(pruned, path, record)
    device = evaluator.device
    full_speed = measure_speed(model, *speed_shape, device, SPEED_REPEATS)
    pruned_speed = measure_speed(pruned, *speed_shape, device, SPEED_REPEATS)
    return {
        **record,
        "tokens_per_s_full": full_speed,
        "tokens_per_s_pruned": pruned_speed,
        "speedup": pruned_speed / full_speed,
        "speed_batch": list(speed_shape),
        "speed_device": str(device),
    }
