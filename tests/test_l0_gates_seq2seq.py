"""Voita et al.'s L0 gates over an encoder-decoder's three kinds of heads (ablation/methods/l0_gates.py on the grid of
labels.KindRows): the expected L0 penalty counts exactly the heads each layer of each kind has, the gated forward equals
EncoderDecoder's with the sampled gates by kind (zero and mean ablation), in float32 and float64; trained gates keep the
one cross-attention head a constructed model's targets need and close the others; the scan's table names the kinds."""

import math

import pytest
import torch
from seq2seq_cases import pairs, tiny_seq2seq

from headcount.ablation.engine.metrics import Loss
from headcount.ablation.engine.seq2seq_evaluator import by_kind
from headcount.ablation.methods.l0_gates import expected_open, gated_point_values, sample_gates, train_l0_gates
from headcount.config.ablation import L0GatesConfig
from headcount.data.examples import to_batches
from headcount.model.encoder_decoder import EncoderDecoder

DTYPES = [torch.float32, torch.float64]
TOL = {torch.float32: 1e-5, torch.float64: 1e-12}


def token_losses(model: EncoderDecoder, batch: dict, gates: dict | None = None, replacements=None) -> torch.Tensor:
    """Each marked target token's cross-entropy, row-major: EncoderDecoder's forward with gates by kind."""
    logits = model(batch["src_ids"], batch["input_ids"], gates=gates, replacements=replacements,
                   src_keep=batch["src_mask"])[:, :-1]  # fmt: skip
    logp = torch.log_softmax(logits.double(), -1).gather(-1, batch["input_ids"][:, 1:, None])[..., 0]
    return -logp[batch["loss_mask"][:, 1:]]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", ["zero", "mean"])
def test_the_gated_forward_is_encoder_decoders_with_per_example_gates_by_kind(dtype, mode):
    model, batch = tiny_seq2seq(dtype), pairs(6)
    grid = model.heads_per_layer
    g = torch.Generator().manual_seed(2)
    gates_BLH = torch.rand(len(batch["src_ids"]), len(grid), max(grid), generator=g).to(dtype)
    means = [torch.randn(n, model.attention(*grid.rows[row]).head_dim, generator=g).to(dtype)
             for row, n in enumerate(grid)] if mode == "mean" else None  # fmt: skip
    with torch.no_grad():
        got = gated_point_values(model, batch, gates_BLH, means, Loss())
        expected = token_losses(
            model, batch, by_kind(model, gates_BLH), None if means is None else by_kind(model, means)
        )
        assert (expected - token_losses(model, batch)).abs().max() > 1e-3  # the gates matter
    torch.testing.assert_close(got.double(), expected, rtol=0, atol=TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_first_steps_penalty_and_task_loss_equal_a_hand_computation(dtype):
    model, batch = tiny_seq2seq(dtype), pairs(6)
    cfg = L0GatesConfig(steps=1, penalty=0.05, seed=7)
    result = train_l0_gates(model, [batch], cfg, None, progress=False)
    grid = model.heads_per_layer
    assert sum(grid) == 3 * 2 + 3 * 2 + 2 * 2  # the narrower cross-attention rows have 2 heads, not 3
    p_open = 1 / (1 + math.exp(-(cfg.log_alpha_init - cfg.beta * math.log(-cfg.gamma / cfg.zeta))))
    assert result.history[0]["expected_l0"] == pytest.approx(16 * p_open, rel=1e-6)
    # the same hard-concrete draw by hand: u ~ U(0, 1) per example and grid cell, the stretched, clamped sigmoid
    generator = torch.Generator().manual_seed(cfg.seed)
    log_alpha = torch.full((len(grid), max(grid)), cfg.log_alpha_init, dtype=torch.promote_types(dtype, torch.float32))
    u = torch.rand((len(batch["src_ids"]), *log_alpha.shape), generator=generator, dtype=log_alpha.dtype)
    eps = torch.finfo(log_alpha.dtype).eps
    u = u.clamp(eps, 1 - eps)
    s = torch.sigmoid((torch.log(u) - torch.log(1 - u) + log_alpha) / cfg.beta)
    gates = (s * (cfg.zeta - cfg.gamma) + cfg.gamma).clamp(0, 1)
    exists = torch.tensor([[h < n for h in range(max(grid))] for n in grid])
    with torch.no_grad():
        by_hand = token_losses(model, batch, by_kind(model, (gates * exists).to(dtype))).mean()
    assert result.history[0]["task_loss"] == pytest.approx(float(by_hand), rel=1e-5 if dtype == torch.float32 else 1e-9)
    assert torch.isinf(result.log_alpha[~exists]).all() and not result.keep_LH[~exists].any()
    same = sample_gates(log_alpha, len(batch["src_ids"]), cfg, torch.Generator().manual_seed(cfg.seed))
    torch.testing.assert_close(same, gates)
    assert expected_open(result.log_alpha, cfg)[~exists].eq(0).all()


def planted_cross_head(dtype: torch.dtype) -> tuple[EncoderDecoder, list[dict]]:
    """A model whose every head but cross.L1H0 writes nothing (its W_O slice zero, so its gate cannot change the
    loss), cross.L1H0's output scaled up, and targets the model's own greedy tokens: the task needs cross.L1H0 alone."""
    model = tiny_seq2seq(dtype, seed=3)
    with torch.no_grad():
        for kind, counts in model.kind_heads_per_layer.items():
            for layer, n in enumerate(counts):
                attn = model.attention(kind, layer)
                D = attn.head_dim
                for head in range(n):
                    scale = 8.0 if (kind, layer, head) == ("cross", 1, 0) else 0.0
                    attn.out.weight[:, head * D : (head + 1) * D] *= scale
    batch = pairs(n=16, seed=4)
    with torch.no_grad():
        logits = model(batch["src_ids"], batch["input_ids"], src_keep=batch["src_mask"])
    targets = batch["input_ids"].clone()
    targets[:, 1:] = logits[:, :-1].argmax(-1)  # position t predicts t + 1: the clean model's own choice
    targets = targets.masked_fill(~batch["loss_mask"], 0)
    return model, to_batches({**batch, "input_ids": targets}, 8, torch.device("cpu"))


@pytest.mark.parametrize("dtype", DTYPES)
def test_trained_gates_keep_the_one_cross_head_the_targets_need_and_close_the_rest(dtype):
    model, batches = planted_cross_head(dtype)
    grid = model.heads_per_layer
    planted = grid.row("cross", 1), 0
    with torch.no_grad():
        closed = torch.ones(len(grid), max(grid), dtype=dtype)
        closed[planted] = 0
        loss_without = token_losses(model, batches[0], by_kind(model, closed)).mean()
        assert float(loss_without - token_losses(model, batches[0]).mean()) > 0.5  # it carries the task
    result = train_l0_gates(model, batches, L0GatesConfig(steps=150, penalty=0.05), None, progress=False)
    assert result.keep_LH[planted] and result.n_kept == 1
    assert grid.head_label(*result.keep_LH.nonzero()[0].tolist()) == "cross.L1H0"
