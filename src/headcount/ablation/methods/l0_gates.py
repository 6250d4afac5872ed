"""Learned L0 head gates (Voita et al. 2019): which heads does a trained model need?

Each head gets one learnable log_alpha; its gate is a hard-concrete variable (Louizos et al. 2018): with u ~ U(0, 1),
s = sigmoid((log u - log(1 - u) + log_alpha) / beta), gate = clamp(s (zeta - gamma) + gamma, 0, 1). Stretching to
(gamma, zeta) and clamping gives exact 0s and 1s with positive probability, and P(gate > 0) = sigmoid(log_alpha -
beta log(-gamma / zeta)) is differentiable, so the expected number of open heads (expected L0) can join the loss.

Unlike Voita, who fine-tunes the whole model with the gates, the model's weights stay frozen here: the gates then
measure which heads the trained model itself needs, not which heads a model retrained around the gates could live
with. The gates act on z through the model's own gate interface, one sample per example, so a closed head takes its
replacement: zero (Voita) or, when `replacements` is given, e.g. its mean.

The penalty weight lambda on the expected L0 is either
- fixed: loss = task + lambda * expected_L0 (Voita's objective), or
- steered to a target of k heads: loss = task + lambda (E - k_t) + lambda2 (E - k_t)^2 with E the expected L0,
  minimised over log_alpha while lambda and lambda2 rise by dual ascent, lambda += penalty_lr (E - k_t) and
  lambda2 += penalty_lr (E - k_t)^2, after every step (the Lagrangian of Wang et al. 2020 and Xia et al. 2022).
  The target k_t moves linearly from all heads to k over the first `target_warmup` of the steps, then stays: a
  target that jumps to k at once lets lambda overshoot and close heads that the frozen gates never reopen (a closed
  head's gradient vanishes). The constraint is an equality, so lambda may turn negative and push heads back open.
At the end a head is kept when its gate is more likely open than closed, P(gate > 0) > 1/2: the same event the
expected L0 counts, so a run steered to k heads keeps about k. In terms of Louizos's deterministic test-time gate,
clamp(sigmoid(log_alpha) (zeta - gamma) + gamma, 0, 1), that is a threshold of about 0.1 rather than 0.5 (with the
defaults); the 0.5 threshold would drop the marginal head that the constraint leaves half open, one head short of k.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import pandas as pd
import torch
from rich.progress import track
from torch import Tensor

from headcount.ablation.engine.heads import existing_heads
from headcount.ablation.engine.metrics import Loss, Metric, Targets, point_values
from headcount.ablation.engine.modes import Replacements
from headcount.ablation.engine.seq2seq_evaluator import by_kind, grid_replacements
from headcount.config.ablation import KEY, L0GatesConfig, validate_l0_config
from headcount.errors import ConfigError
from headcount.model.encoder_decoder import EncoderDecoder
from headcount.model.intervention import gated
from headcount.model.transformer import Transformer


@dataclass
class L0Result:
    log_alpha: Tensor  # (L, H); -inf for heads a pruned layer lacks
    gate_LH: Tensor  # (L, H) Louizos's deterministic test-time gate; 0 for heads a pruned layer lacks
    keep_LH: Tensor  # (L, H) bool: P(gate > 0) > 1/2
    n_kept: int
    history: list[dict]  # per step: step, task_loss, expected_l0, penalty_weight, quadratic_weight, target
    target_heads: int | None


def sample_gates(log_alpha_LH: Tensor, batch: int, cfg: L0GatesConfig, generator: torch.Generator) -> Tensor:
    """(B, L, H) hard-concrete samples, one per example, in [0, 1] with exact 0s and 1s."""
    # Keep u off 0 and 1: log(0) would turn the whole step into NaN.
    tiny = torch.finfo(log_alpha_LH.dtype).eps
    u_BLH = torch.rand(
        (batch, *log_alpha_LH.shape), generator=generator, dtype=log_alpha_LH.dtype, device=log_alpha_LH.device
    ).clamp(tiny, 1 - tiny)
    s_BLH = torch.sigmoid((u_BLH.log() - (-u_BLH).log1p() + log_alpha_LH) / cfg.beta)
    return (s_BLH * (cfg.zeta - cfg.gamma) + cfg.gamma).clamp(0, 1)


def expected_open(log_alpha_LH: Tensor, cfg: L0GatesConfig) -> Tensor:
    """(L, H) P(gate > 0), whose sum is the expected L0 norm of the gates."""
    return torch.sigmoid(log_alpha_LH - cfg.beta * math.log(-cfg.gamma / cfg.zeta))


def deterministic_gates(log_alpha_LH: Tensor, cfg: L0GatesConfig) -> Tensor:
    """(L, H) the test-time gate of Louizos et al.: the stretched sigmoid without noise."""
    return (torch.sigmoid(log_alpha_LH) * (cfg.zeta - cfg.gamma) + cfg.gamma).clamp(0, 1)


def train_l0_gates(
    model: "Transformer | EncoderDecoder",
    batches: list[dict],
    cfg: L0GatesConfig,
    target_heads: int | None,
    replacements: Replacements | list | None = None,
    progress: bool = True,
    metric: Metric | None = None,
) -> L0Result:
    """Train one log_alpha per head on the frozen model for cfg.steps steps: with target_heads None, under the fixed
    penalty cfg.penalty; else steered toward target_heads kept heads (module docstring). Batches are the evaluator's
    (input_ids and loss_mask, or a task's score points), cycled; `replacements` a session's Replacements, or one per
    layer as in Transformer.forward. The task term is the metric (default: loss), negated where higher is better.
    Heads a pruned layer lacks stay off and are not counted. On an encoder-decoder the gates are over its grid of three
    kinds (encoder self-attention, decoder self-attention, cross-attention; labels.KindRows), its batches the
    sequence-to-sequence ones (src_ids, src_mask, input_ids, loss_mask). The model's requires_grad flags and
    train/eval mode are restored afterwards."""
    metric = metric or Loss()
    n_heads = sum(model.heads_per_layer)
    # This run is the config with this one target: the other targets of cfg are other runs.
    validate_l0_config(replace(cfg, target_heads=target_heads), n_heads)
    if not batches:
        raise ConfigError(f"{KEY}.n_batches", 0, "L0 gate training needs at least one batch")
    param = next(model.parameters())
    exists_LH = existing_heads(model.heads_per_layer, model.max_heads, param.device)
    # At least float32: half-precision log_alpha would round Adam's small steps away.
    dtype = torch.promote_types(param.dtype, torch.float32)
    log_alpha_LH = torch.full(exists_LH.shape, cfg.log_alpha_init, dtype=dtype, device=param.device)
    log_alpha_LH.requires_grad_(True)
    optimizer = torch.optim.Adam([log_alpha_LH], lr=cfg.lr)
    generator = torch.Generator(device=param.device).manual_seed(cfg.seed)
    penalty_weight, quadratic_weight = cfg.penalty or 0.0, 0.0
    warmup_steps = max(1, round(cfg.target_warmup * cfg.steps))
    used_batches = batches[: cfg.n_batches]
    history = []
    requires_grad = [p.requires_grad for p in model.parameters()]
    was_training = model.training
    model.requires_grad_(False).eval()
    try:
        for step in track(range(cfg.steps), description="L0 gates", disable=not progress):
            batch = used_batches[step % len(used_batches)]
            gates_BLH = sample_gates(log_alpha_LH, len(batch["input_ids"]), cfg, generator) * exists_LH
            values_N = gated_point_values(model, batch, gates_BLH.to(param.dtype), replacements, metric)
            task_loss = metric.badness(values_N).mean()
            expected_l0 = (expected_open(log_alpha_LH, cfg) * exists_LH).sum()
            if target_heads is None:
                target_now, penalty = None, penalty_weight * expected_l0
            else:
                target_now = n_heads + (target_heads - n_heads) * min(1.0, (step + 1) / warmup_steps)
                violation = expected_l0 - target_now
                penalty = penalty_weight * violation + quadratic_weight * violation**2
            optimizer.zero_grad()
            (task_loss + penalty).backward()
            optimizer.step()
            history.append(
                dict(
                    step=step,
                    task_loss=task_loss.item(),
                    expected_l0=expected_l0.item(),
                    penalty_weight=penalty_weight,
                    quadratic_weight=quadratic_weight,
                    target=target_now,
                )
            )
            if target_heads is not None:
                penalty_weight += cfg.penalty_lr * violation.item()
                quadratic_weight += cfg.penalty_lr * violation.item() ** 2
    finally:
        for p, flag in zip(model.parameters(), requires_grad):
            p.requires_grad_(flag)
        model.train(was_training)
    log_alpha_LH = log_alpha_LH.detach().masked_fill(~exists_LH, float("-inf")).cpu()
    keep_LH = expected_open(log_alpha_LH, cfg) > 0.5
    return L0Result(
        log_alpha_LH, deterministic_gates(log_alpha_LH, cfg), keep_LH, int(keep_LH.sum()), history, target_heads
    )


def gated_point_values(
    model: "Transformer | EncoderDecoder",
    batch: dict,
    gates_BLH: Tensor,
    replacements: Replacements | list | None,
    metric: Metric,
) -> Tensor:
    """(N,) the metric's primary value at each score point of the batch with per-example gates (B, L, H) over the
    model's heads: a one-stack model's layers, or an encoder-decoder's grid of three kinds (labels.KindRows) split by
    kind, its replacements per grid row (seq2seq_evaluator.py), scored at its teacher-forced targets."""
    param = next(model.parameters())
    batch = {name: value.to(param.device) if isinstance(value, Tensor) else value for name, value in batch.items()}
    if isinstance(model, EncoderDecoder):
        values = replacements
        if isinstance(replacements, Replacements):
            with torch.no_grad():
                values = grid_replacements(model, replacements, batch)
        gates = by_kind(model, gates_BLH)
        by_row = None if values is None else by_kind(model, values)
        src_keep = batch["src_mask"]
        memory = model.encode(batch["src_ids"], gates["enc"], None if by_row is None else by_row["enc"], src_keep)
        final_BTC = model.decode_stream(batch["input_ids"], memory, src_keep, gates["dec"], gates["cross"], by_row)
        return point_values(model.decoder, final_BTC, Targets.of(batch), metric)[0, :, 0]
    values, where_BT = replacements, None
    if isinstance(replacements, Replacements):
        with torch.no_grad():
            replaced = replacements.for_batch(model, batch)
        values, where_BT = replaced.values, replaced.where_BT
    final_BTC = model.forward_layers(model.embed(batch["input_ids"]), 0, gated(gates_BLH, values, where_BT))
    return point_values(model, final_BTC, Targets.of(batch), metric)[0, :, 0]


def l0_gates_table(results: list[L0Result], evaluate: Callable[[Tensor], dict]) -> pd.DataFrame:
    """Long format, one row per (run, existing head): target_heads, n_kept, penalty_weight (lambda at the last step:
    the fixed penalty, or where dual ascent arrived), layer, head, kept, log_alpha, gate (the deterministic test-time
    gate), and the exact metric columns of the run's binary mask, `evaluate(masks_MLH) -> {column: (M,)}` (for loss:
    loss and acc)."""
    masks_MLH = torch.stack([result.keep_LH.float() for result in results])
    scores = {column: values.detach().double().cpu() for column, values in evaluate(masks_MLH).items()}
    rows = [
        dict(
            target_heads=result.target_heads,
            n_kept=result.n_kept,
            penalty_weight=result.history[-1]["penalty_weight"],
            layer=layer,
            head=head,
            kept=bool(result.keep_LH[layer, head]),
            log_alpha=float(result.log_alpha[layer, head]),
            gate=float(result.gate_LH[layer, head]),
            **{column: float(values[m]) for column, values in scores.items()},
        )
        for m, result in enumerate(results)
        for layer, head in result.log_alpha.isfinite().nonzero().tolist()  # -inf marks heads a layer lacks
    ]
    return pd.DataFrame(rows)
