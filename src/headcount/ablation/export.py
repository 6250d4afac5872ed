"""Structural export (ablation.prune.export): which heads to remove (exactly ablation.prune.heads, the mask the l0_gates
scan learned, or what a pruning order removes at a given or its prunable fraction), the smaller checkpoint
ablation/pruned.ckpt (pruned.mean.ckpt under mean ablation) without them, and how much faster it runs than the full
model, timed in alternation over SPEED_REPEATS repeats (median and range). An export that would remove no head is
refused; every export prints the heads it removed and the speedup, and records both in summary.json."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from torch import Tensor

from headcount.ablation.engine.evaluator import MaskEvaluator
from headcount.ablation.engine.heads import existing_heads
from headcount.ablation.engine.masks import HeadMask, check_head_exists, masks_to_gates
from headcount.ablation.engine.metrics import METRICS
from headcount.ablation.engine.seq2seq_evaluator import Seq2SeqEvaluator
from headcount.ablation.methods.importance import Importance
from headcount.ablation.methods.pruning import PRUNING_ORDERS, Ranking
from headcount.ablation.scans.context import ScanContext
from headcount.ablation.scans.l0_gates import l0_keep_gates
from headcount.ablation.scans.pruning import prunable_fraction
from headcount.ablation.scans.single_head import single_head_delta
from headcount.config.ablation import PruneExportConfig, PruningConfig
from headcount.errors import ConfigError
from headcount.labels import grid_head_label
from headcount.model.encoder_decoder import EncoderDecoder
from headcount.model.transformer import Transformer

SPEED_REPEATS = 7
NOTHING_TO_EXPORT = "an export needs at least one head to remove"


def check_export(prune: PruneExportConfig, heads_per_layer: list[int]) -> None:
    """What the export settings can get wrong against the model alone: heads that do not exist, and a choice that
    removes no head."""
    for pair in prune.heads or []:
        if not (isinstance(pair, list) and len(pair) == 2):
            raise ConfigError("ablation.prune.heads", pair, "each entry must be a [layer, head] pair")
        check_head_exists(*pair, heads_per_layer, "ablation.prune.heads")
    if not prune.export:
        return
    if prune.heads is not None and not prune.heads:
        raise ConfigError("ablation.prune.heads", [], f"names no heads: {NOTHING_TO_EXPORT}")
    total = sum(heads_per_layer)
    if prune.heads is None and prune.fraction is not None and round(prune.fraction * total) == 0:
        removes = f"removes round({prune.fraction} x {total}) = 0 heads"
        raise ConfigError("ablation.prune.fraction", prune.fraction, f"{removes}: {NOTHING_TO_EXPORT}")


def export_needs(prune: PruneExportConfig) -> list[str]:
    """The scans an export reads (the session runs them first): the l0_gates scan for its learned mask, the pruning
    scan for a prunable fraction, single_head for its order."""
    if not prune.export or prune.heads is not None:
        return []
    if prune.order == "l0_gates":
        return ["l0_gates"]
    return [
        *(["pruning"] if prune.fraction is None else []),
        *(["single_head"] if prune.order == "single_head" else []),
    ]


def export_pruned_model(session: ScanContext) -> None:
    """Write ablation/pruned[.<mode>].ckpt without the heads the settings choose, print what went and how much faster
    the model got, and record it in summary.json. ConfigError, before anything is written, when no head would go."""
    s, prune, hpl = session.settings, session.settings.prune, session.model.heads_per_layer
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
    if not bool(((keep_LH.cpu() == 0) & session.evaluator.exists_LH.cpu()).any()):
        raise nothing_removed(prune, s.pruning.tolerance)
    path = session.address.file("pruned", ".ckpt")
    means = session.replacements.constant_per_head()
    speed_shape = (s.batch_size, session.batches[0]["input_ids"].shape[1])
    evaluator, model = session.evaluator, session.model
    record = export_pruned(model, evaluator, keep_LH, means, path, {**meta, "mode": s.mode}, speed_shape)
    session.files.note_written(path)
    session.files.update_summary({"pruned": record})
    print_export(record, path, sum(hpl))


def nothing_removed(prune: PruneExportConfig, tolerance: float) -> ConfigError:
    if prune.order == "l0_gates":
        return ConfigError("ablation.prune.order", "l0_gates", f"its gates keep every head: {NOTHING_TO_EXPORT}")
    if prune.fraction is not None:
        return ConfigError("ablation.prune.fraction", prune.fraction, f"removes no heads: {NOTHING_TO_EXPORT}")
    return ConfigError(
        "ablation.prune.order",
        prune.order,
        f"prunes no head within ablation.pruning.tolerance={tolerance} (prunable fraction 0): {NOTHING_TO_EXPORT}; "
        "choose heads with ablation.prune.fraction or ablation.prune.heads",
    )


def print_export(record: dict, path: Path, n_heads: int) -> None:
    """What an export did, in three lines: the heads removed, the loss and size, the speedup with its spread."""
    batch, seq_len = record["speed_batch"]
    Console(stderr=True).print(
        f"[green]exported[/green] {escape(str(path))}: removed {record['n_heads_removed']} of {n_heads} heads "
        f"({', '.join(record['heads_removed_names'])}), chosen by {record['chosen_by']}\n"
        f"  {measured(record)}; "
        f"{record['params_pruned']:,} of {record['params_full']:,} parameters\n"
        f"  speedup {record['speedup']:.2f}x (median of {record['speed_repeats']} repeats, range "
        f"{record['speedup_min']:.2f}-{record['speedup_max']:.2f}x; {record['tokens_per_s_pruned']:,.0f} against "
        f"{record['tokens_per_s_full']:,.0f} tokens/s, batch {batch} x {seq_len} on {record['speed_device']})",
        highlight=False,
        soft_wrap=True,
    )


def measured(record: dict) -> str:
    """The pruned model's metric against the masked model's, e.g. "loss 2.3456 nats (masked model 2.3456)"."""
    metric = METRICS[record.get("metric", "loss")]() if record.get("metric", "loss") in METRICS else None
    primary = metric.primary if metric is not None else record["metric"]
    unit = f" {metric.unit}" if metric is not None else ""
    return f"{primary} {record[f'{primary}_pruned']:.4f}{unit} (masked model {record[f'{primary}_masked']:.4f})"


def removal_gates(
    order: str,
    fraction: float,
    heads_per_layer: list[int],
    cfg: PruningConfig,
    seed: int,
    importance_fn: Callable[[Tensor], Importance],
    single_head_delta: Callable[[], Tensor],
) -> Tensor:
    """(L, H) keep-gates removing round(fraction * heads) heads the way that order's pruning curve does at that
    fraction (random: the first of its seeds)."""
    exists_LH = existing_heads(heads_per_layer)
    ranking = Ranking(importance_fn, single_head_delta, exists_LH, cfg, seed)
    return PRUNING_ORDERS.get(order, "ablation.prune.order")().mask_at(ranking, round(fraction * int(exists_LH.sum())))


def export_pruned(
    model: Transformer | EncoderDecoder,
    evaluator: MaskEvaluator,
    keep_LH: Tensor,
    replacements: list[Tensor] | None,
    path: Path,
    meta: dict,
    speed_shape: tuple[int, int],
) -> dict:
    """Write the model without the heads keep_LH switches off (over its grid: an encoder-decoder's three kinds, its
    heads_per_layer the grid's rows and its names enc.L0H1, cross.L1H0); return what summary.json records about it:
    the masked and the pruned model's metric (equal, up to rounding) and their forward throughput on speed_shape
    (B, T) batches (compare_speed: medians, the speedup's range)."""
    from headcount.ablation.methods.structural import compare_speed, prune_heads, save_pruned_checkpoint

    exists_LH = evaluator.exists_LH.cpu()
    remove_LH = (keep_LH.cpu() == 0) & exists_LH
    pruned = prune_heads(model, remove_LH, replacements)
    primary = evaluator.metric.primary
    masked_value = float(evaluator.evaluate(keep_LH[None])[primary][0])
    # the pruned model scored as the session scores: an encoder-decoder by its teacher-forced targets
    Evaluator = Seq2SeqEvaluator if isinstance(model, EncoderDecoder) else MaskEvaluator
    pruned_value = Evaluator(pruned, evaluator.batches, metric=evaluator.metric).baseline()[primary]
    heads_removed = remove_LH.nonzero().tolist()
    grid = model.heads_per_layer
    record = {
        **meta,
        "path": path.name,
        "heads_removed": heads_removed,
        "heads_removed_names": [grid_head_label(grid, layer, head) for layer, head in heads_removed],
        "n_heads_removed": len(heads_removed),
        "heads_per_layer": list(pruned.heads_per_layer),
        "params_full": model.num_params(),
        "params_pruned": pruned.num_params(),
        "metric": evaluator.metric.name,
        f"{primary}_masked": masked_value,
        f"{primary}_pruned": pruned_value,
    }
    save_pruned_checkpoint(pruned, path, record)
    device = evaluator.device
    speed = compare_speed(model, pruned, *speed_shape, device, SPEED_REPEATS)
    return {**record, **speed, "speed_batch": list(speed_shape), "speed_device": str(device)}
