"""Gradient head importance against a central finite difference of the masked loss, in float64."""

import pytest
import torch

from headcount.ablation.methods.importance import gradient_importance
from headcount.metrics import masked_loss_and_accuracy
from headcount.model import AttentionConfig, ModelConfig, Transformer
from headcount.model.intervention import Gates, Intervention

L, H, VOCAB = 2, 3, 20
PARTIAL_MASK_LH = torch.tensor([[1.0, 0.5, 0.0], [1.0, 1.0, 0.25]], dtype=torch.float64)


def make_model(combine="concat", heads_per_layer=None) -> Transformer:
    torch.manual_seed(0)
    attn = AttentionConfig(n_heads=H, combine=combine)
    cfg = ModelConfig(
        n_layers=L, d_model=24, n_ctx=8, vocab_size=VOCAB, attn=attn, mlp=True, heads_per_layer=heads_per_layer
    )
    model = Transformer(cfg).double()
    with torch.no_grad():  # larger weights than the init's, so that every head moves the loss clearly
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
    return model


def make_batches(n=2, B=2, T=8) -> list[dict]:
    g = torch.Generator().manual_seed(1)
    return [
        {"input_ids": torch.randint(0, VOCAB, (B, T), generator=g), "loss_mask": torch.rand(B, T, generator=g) > 0.3}
        for _ in range(n)
    ]


def unchecked(gates, replacements=None, where=None) -> Intervention:
    """Head gates at any real value: the Gates hook's arithmetic, called from a hook that is no Gates (not checked)."""
    gates_hook = Gates(gates, replacements, where)
    return Intervention([(site, lambda z, s: gates_hook(z, s)) for site, _ in gates_hook.hooks()])


def finite_difference_importance(model, batches, mask_LH, replacements, eps=1e-5) -> torch.Tensor:
    """Mean over batches of |L(g + eps e_lh) - L(g - eps e_lh)| / 2 eps. Gates of 1 or 0 need a step outside [0, 1],
    which the forward pass refuses as user input but computes fine, so the gates run as a plain hook (a Gates hook
    is range-checked; its arithmetic is not)."""
    importance_LH = torch.zeros(L, H, dtype=torch.float64)
    for batch in batches:
        for layer in range(L):
            for head in range(H):
                losses = []
                for sign in (1, -1):
                    gates_LH = mask_LH.clone()
                    gates_LH[layer, head] += sign * eps
                    logits = model(batch["input_ids"], unchecked(gates_LH, replacements))
                    losses.append(masked_loss_and_accuracy(logits, batch["input_ids"], batch["loss_mask"])[0])
                importance_LH[layer, head] += (losses[0] - losses[1]).abs() / (2 * eps)
    return importance_LH / len(batches)


@pytest.mark.parametrize("combine", ["concat", "sum"])
@pytest.mark.parametrize("mode", ["zero", "mean"])
def test_matches_central_finite_difference_under_a_partial_mask(combine, mode):
    model, batches = make_model(combine), make_batches()
    g = torch.Generator().manual_seed(2)
    replacements = None if mode == "zero" else [torch.randn(H, model.head_dim, generator=g).double() for _ in range(L)]
    expected_LH = finite_difference_importance(model, batches, PARTIAL_MASK_LH, replacements)
    expected_LH[PARTIAL_MASK_LH == 0] = 0  # heads already off score 0 by definition
    assert (expected_LH[PARTIAL_MASK_LH > 0] > 1e-3).all()  # every live head matters: the check is not vacuous
    raw_LH = gradient_importance(model, batches, replacements, normalize=False, mask_LH=PARTIAL_MASK_LH)
    assert raw_LH.dtype == torch.float64 and raw_LH.shape == (L, H)
    torch.testing.assert_close(raw_LH, expected_LH, rtol=1e-6, atol=1e-9)
    normalized_LH = gradient_importance(model, batches, replacements, normalize=True, mask_LH=PARTIAL_MASK_LH)
    torch.testing.assert_close(normalized_LH, expected_LH / expected_LH.norm(dim=1, keepdim=True), rtol=1e-6, atol=1e-9)


def test_default_mask_is_all_ones_and_leaves_the_model_as_it_was():
    model, batches = make_model(), make_batches()
    model.train()
    importance_LH = gradient_importance(model, batches, normalize=False)
    torch.testing.assert_close(
        importance_LH, gradient_importance(model, batches, normalize=False, mask_LH=torch.ones(L, H)), rtol=0, atol=0
    )
    assert (importance_LH > 0).all()
    assert model.training
    assert all(p.grad is None for p in model.parameters())


def test_fully_masked_layer_and_missing_heads_score_zero():
    model, batches = make_model(heads_per_layer=[3, 2]), make_batches()
    mask_LH = torch.ones(L, H)
    mask_LH[0] = 0
    importance_LH = gradient_importance(model, batches, normalize=True, mask_LH=mask_LH)
    assert torch.equal(importance_LH[0], torch.zeros(H, dtype=torch.float64))
    assert importance_LH[1, 2] == 0  # layer 1 has only two heads
    torch.testing.assert_close(importance_LH[1].norm(), torch.tensor(1.0, dtype=torch.float64))
