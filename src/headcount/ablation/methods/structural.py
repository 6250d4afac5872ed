"""Structural pruning: a smaller Transformer (or EncoderDecoder) without the removed heads, equal to the masked model.

The model does the surgery (`Transformer.select_heads`, built on MultiHeadAttention.select_heads): removing a head
deletes its q, k, v projections and, under concat, its slice of W_o. Zero ablation needs nothing more. Mean ablation
with position-averaged means replaces z_h by a constant r_h, whose contribution to the output is the same at every
position, so it folds into the output bias. This module checks the user's mask, turns a replacement into that per-head
constant (per-position means and resample replacements change with the position or the input and cannot fold), saves
the pruned checkpoint and measures its speed. Heads keep their order; a pruned model numbers its remaining heads
0..n-1 in each layer. An encoder-decoder's mask and replacements are over its grid of three kinds (labels.KindRows),
split by kind for EncoderDecoder.select_heads.
"""

import json
import math
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import lightning
import torch
from torch import Tensor

from headcount.ablation.engine.heads import existing_heads
from headcount.config import plain
from headcount.config.train import OptimConfig, TrainerConfig
from headcount.errors import ConfigError
from headcount.io import atomic_write
from headcount.labels import grid_layer_label
from headcount.model.encoder_decoder import EncoderDecoder
from headcount.model.transformer import Transformer

WARMUP_PASSES = 3
MIN_REPEAT_S = 0.02  # a timed repeat runs at least this long, so that tiny models are not timed at clock resolution


def prune_heads(
    model: "Transformer | EncoderDecoder", remove_LH: Tensor, replacements: list | None = None
) -> "Transformer | EncoderDecoder":
    """A new model without the heads remove_LH marks (bool, (L, max_heads) over the model's grid, True = remove; an
    encoder-decoder's grid is its kinds' rows, labels.KindRows), in the same dtype, device and train/eval mode.
    `replacements` as in Transformer.forward: None (zero ablation) or one entry per grid row, None or a
    position-averaged mean broadcastable to (H, D), folded into the output bias."""
    check_remove_mask(model, remove_LH)
    rows = len(model.heads_per_layer)
    if replacements is not None and len(replacements) != rows:
        raise ValueError(f"replacements needs one entry per layer ({rows}), got {len(replacements)}")
    constants = None if replacements is None else [head_constant(model, row, r) for row, r in enumerate(replacements)]
    if not isinstance(model, EncoderDecoder):
        return model.select_heads(~remove_LH.cpu(), constants)
    from headcount.ablation.engine.seq2seq_evaluator import by_kind

    keep = by_kind(model, ~remove_LH.cpu())
    return model.select_heads(keep, None if constants is None else by_kind(model, constants))


def check_remove_mask(model: "Transformer | EncoderDecoder", remove_LH: Tensor) -> None:
    """Masks index the heads the model has now; a pruned model's removed heads are gone for good."""
    key, hpl = "ablation.prune.heads", model.heads_per_layer
    shape = (len(hpl), max(max(hpl), 1))
    if remove_LH.dtype != torch.bool:
        raise ConfigError(key, f"mask of dtype {remove_LH.dtype}", f"needs a bool {shape} mask, True = remove")
    if tuple(remove_LH.shape) != shape:
        raise ConfigError(
            key,
            f"mask of shape {tuple(remove_LH.shape)}",
            f"needs shape {shape} for heads per layer {list(hpl)}; a pruned checkpoint cannot be un-pruned, "
            "so a mask indexes the heads it has left",
        )
    exists_LH = existing_heads(hpl, shape[1])
    missing = (remove_LH.cpu() & ~exists_LH).nonzero()
    if len(missing):
        layer, head = missing[0].tolist()
        raise ConfigError(
            key,
            [layer, head],
            f"a pruned checkpoint cannot be un-pruned: layer {grid_layer_label(hpl, layer)} has {hpl[layer]} heads "
            f"left (heads per layer {list(hpl)}), numbered from 0",
        )


def head_constant(model: "Transformer | EncoderDecoder", layer: int, replacement: Tensor | None) -> Tensor | None:
    """The grid row's replacement as one constant per head (H, D), or None for zero ablation; a ConfigError when it
    varies with the position or the input."""
    if replacement is None:
        return None
    hpl = model.heads_per_layer
    H = hpl[layer]
    D = model.attention(*model.heads_per_layer.rows[layer]).head_dim if isinstance(model, EncoderDecoder) else None
    D = model.head_dim if D is None else D
    r_HD = position_constant(replacement, H, D)
    if r_HD is None:
        raise ConfigError(
            "ablation.mode",
            f"replacement of shape {tuple(replacement.shape)} in layer {grid_layer_label(hpl, layer)}",
            f"structural pruning folds only zero or position-averaged mean ablation (one ({H}, {D}) mean per layer) "
            "into the output bias; per-position means and resample vary with the position or the input",
        )
    return r_HD


def position_constant(replacement: Tensor, H: int, D: int) -> Tensor | None:
    """The replacement as (H, D) if it is the same at every position and for every input, else None."""
    if replacement.ndim > 4 or any(size != 1 for size in replacement.shape[:-2]):
        return None
    r = replacement.reshape(replacement.shape[-2:]) if replacement.ndim > 2 else replacement
    try:
        return torch.broadcast_to(r, (H, D))
    except RuntimeError:  # not broadcastable to this layer's heads at all
        return None


def save_pruned_checkpoint(model: Transformer, path: str | Path, meta: dict) -> None:
    """Write `model` as a headcount Lightning checkpoint, atomically, so it loads everywhere a checkpoint loads
    (run_dir.load_model, HeadcountModule.load_from_checkpoint). `meta` (plain JSON-like values, so that
    weights-only loading accepts it) goes under "headcount_pruned"; training settings are the defaults."""
    checkpoint = {
        "state_dict": {f"model.{name}": tensor.detach().cpu() for name, tensor in model.state_dict().items()},
        "hyper_parameters": {
            "model": model_record(model),
            "optim": plain(OptimConfig()),
            "max_steps": TrainerConfig().max_steps,
            "compile": False,
        },
        "pytorch-lightning_version": lightning.__version__,
        "headcount_pruned": json.loads(json.dumps(meta)),
    }
    atomic_write(path, lambda f: torch.save(checkpoint, f), binary=True)


def model_record(model: "Transformer | EncoderDecoder") -> dict:
    """The model's config as a checkpoint stores it: a pruned encoder-decoder's config records each kind's heads per
    layer itself (EncoderDecoder.select_heads); a one-stack model's heads_per_layer is its own."""
    if isinstance(model, EncoderDecoder):
        return plain(model.cfg)
    return {**plain(model.cfg), "heads_per_layer": list(model.heads_per_layer)}


@torch.no_grad()
def measure_speed(model: Transformer, batch_size: int, seq_len: int, device: str | torch.device, repeats: int) -> float:
    """Forward-pass throughput in tokens/s on random tokens, after a few warmup passes. Moves the model to `device`
    (and leaves it there); times in eval mode and restores the train/eval mode afterwards."""
    if repeats < 1:
        raise ValueError(f"repeats must be a positive integer, got {repeats}")
    inputs = random_inputs(model, batch_size, seq_len, device)
    with timed_in_eval_mode(model, device):
        for _ in range(WARMUP_PASSES):
            model(*inputs)
        seconds = time_passes(model, inputs, repeats)
    return batch_size * seq_len * repeats / seconds


@torch.no_grad()
def compare_speed(
    full: Transformer, pruned: Transformer, batch_size: int, seq_len: int, device: str | torch.device, repeats: int
) -> dict:
    """Both models' forward throughput on the same random tokens, timed in alternation `repeats` times after warmup,
    so that a drift in the machine's speed hits both alike. Each repeat runs enough passes to last MIN_REPEAT_S.
    Returns each model's median tokens/s and the speedup's median, min and max over the repeats."""
    if repeats < 1:
        raise ValueError(f"repeats must be a positive integer, got {repeats}")
    inputs = random_inputs(full, batch_size, seq_len, device)
    with timed_in_eval_mode(full, device), timed_in_eval_mode(pruned, device):
        for _ in range(WARMUP_PASSES):
            full(*inputs), pruned(*inputs)
        passes = max(1, math.ceil(MIN_REPEAT_S / time_passes(full, inputs, 1)))
        tokens = batch_size * seq_len * passes
        full_speeds, pruned_speeds = [], []
        for _ in range(repeats):
            full_speeds.append(tokens / time_passes(full, inputs, passes))
            pruned_speeds.append(tokens / time_passes(pruned, inputs, passes))
    speedups = [p / f for f, p in zip(full_speeds, pruned_speeds)]
    return {
        "tokens_per_s_full": statistics.median(full_speeds),
        "tokens_per_s_pruned": statistics.median(pruned_speeds),
        "speedup": statistics.median(speedups),
        "speedup_min": min(speedups),
        "speedup_max": max(speedups),
        "speed_repeats": repeats,
        "speed_passes_per_repeat": passes,
    }


def random_inputs(
    model: "Transformer | EncoderDecoder", batch_size: int, seq_len: int, device: str | torch.device
) -> tuple[Tensor, ...]:
    """The forward's random token inputs: (B, T) tokens, or an encoder-decoder's source and target, both (B, T) (its
    tokens per second count the target's)."""
    generator = torch.Generator().manual_seed(0)
    shape = (batch_size, seq_len)
    count = 2 if isinstance(model, EncoderDecoder) else 1
    return tuple(
        torch.randint(0, model.cfg.vocab_size, shape, generator=generator).to(torch.device(device))
        for _ in range(count)
    )


@contextmanager
def timed_in_eval_mode(model: Transformer, device: str | torch.device) -> Iterator[None]:
    """The model on `device` (where it stays) in eval mode, its train/eval mode restored afterwards."""
    was_training = model.training
    model.to(torch.device(device)).eval()
    try:
        yield
    finally:
        model.train(was_training)


def time_passes(model: "Transformer | EncoderDecoder", inputs: tuple[Tensor, ...], passes: int) -> float:
    """Seconds for `passes` forward passes on `inputs`, queued GPU work included."""
    synchronize(inputs[0].device)
    start = time.perf_counter()
    for _ in range(passes):
        model(*inputs)
    synchronize(inputs[0].device)
    return time.perf_counter() - start


def synchronize(device: torch.device) -> None:
    """CUDA runs asynchronously: wait for queued kernels so the clock measures them."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
