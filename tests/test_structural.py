"""Structural pruning: the pruned model equals the masked model, shrinks by the right amount, saves and loads as a
checkpoint, and refuses what cannot be done (un-pruning, folding a replacement that varies)."""

import pytest
import torch

from headcount.ablation.methods.structural import measure_speed, prune_heads, save_pruned_checkpoint
from headcount.errors import ConfigError
from headcount.model import AttentionConfig, ModelConfig, Transformer
from headcount.model.intervention import gated
from headcount.run_dir import load_model
from headcount.train.module import HeadcountModule

L, H, VOCAB, T = 3, 4, 30, 10
TOL = {torch.float32: 1e-5, torch.float64: 1e-10}


def make_model(dtype=torch.float64, combine="concat", out_bias=True, tie_embeddings=False) -> Transformer:
    torch.manual_seed(0)
    attn = AttentionConfig(n_heads=H, combine=combine, out_bias=out_bias)
    cfg = ModelConfig(
        n_layers=L, d_model=16, n_ctx=T, vocab_size=VOCAB, attn=attn, mlp=True, tie_embeddings=tie_embeddings
    )
    model = Transformer(cfg).to(dtype).eval()
    with torch.no_grad():  # weights larger than the init's, so a wrongly kept or dropped head shows in the logits
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    return model


def tokens(B=3) -> torch.Tensor:
    return torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(1))


def mean_replacements(model: Transformer) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(2)
    dtype = next(model.parameters()).dtype
    return [torch.randn(h, model.head_dim, generator=g).to(dtype) for h in model.heads_per_layer]


def remove_masks() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    random_LH = torch.rand(L, H, generator=g) < 0.5
    layer_gone_LH = torch.rand(L, H, generator=g) < 0.4
    layer_gone_LH[1] = True
    return {"none": torch.zeros(L, H, dtype=torch.bool), "random": random_LH, "layer_gone": layer_gone_LH}


def masked_logits(model, remove_LH, replacements) -> torch.Tensor:
    gates_LH = (~remove_LH).to(next(model.parameters()).dtype)
    return model(tokens(), gated(gates_LH, replacements))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("combine", ["concat", "sum"])
@pytest.mark.parametrize("mode", ["zero", "mean"])
@pytest.mark.parametrize("mask", list(remove_masks()))
def test_pruned_model_equals_masked_model(dtype, combine, mode, mask):
    model, remove_LH = make_model(dtype, combine), remove_masks()[mask]
    replacements = mean_replacements(model) if mode == "mean" else None
    pruned = prune_heads(model, remove_LH, replacements)
    assert pruned.heads_per_layer == (H - remove_LH.sum(1)).tolist()
    assert pruned.cfg.heads_per_layer == pruned.heads_per_layer
    assert next(pruned.parameters()).dtype == dtype and not pruned.training
    expected = masked_logits(model, remove_LH, replacements)
    torch.testing.assert_close(pruned(tokens()), expected, rtol=0, atol=TOL[dtype])


@pytest.mark.parametrize("combine", ["concat", "sum"])
@pytest.mark.parametrize("out_bias", [True, False])
def test_parameter_count_drops_by_the_removed_heads(combine, out_bias):
    model, remove_LH = make_model(combine=combine, out_bias=out_bias), remove_masks()["layer_gone"]
    C, D, n_removed = model.cfg.d_model, model.head_dim, int(remove_LH.sum())
    per_head = 3 * D * C + 3 * D + (D * C if combine == "concat" else 0)  # q, k, v rows and biases; W_o columns
    assert prune_heads(model, remove_LH).num_params() == model.num_params() - n_removed * per_head
    # Folding a mean into a model without out biases gives every layer one.
    folded = prune_heads(model, remove_LH, mean_replacements(model))
    assert folded.cfg.attn.out_bias
    assert folded.num_params() == model.num_params() - n_removed * per_head + (0 if out_bias else L * C)


@pytest.mark.parametrize("combine", ["concat", "sum"])
@pytest.mark.parametrize("mode", ["zero", "mean"])
def test_pruning_a_pruned_model_equals_masking_the_union(combine, mode):
    model, first_LH = make_model(combine=combine), remove_masks()["layer_gone"]
    replacements = mean_replacements(model) if mode == "mean" else None
    once = prune_heads(model, first_LH, replacements)
    kept = [(~first_LH[layer]).nonzero().squeeze(1) for layer in range(L)]
    second_LH = torch.zeros(L, once.max_heads, dtype=torch.bool)
    second_LH[0, 0] = second_LH[2, once.heads_per_layer[2] - 1] = True
    once_replacements = None if replacements is None else [r[k] for r, k in zip(replacements, kept)]
    twice = prune_heads(once, second_LH, once_replacements)
    union_LH = first_LH.clone()
    for layer in range(L):
        union_LH[layer, kept[layer][second_LH[layer, : len(kept[layer])]]] = True
    assert union_LH.sum() == first_LH.sum() + 2
    torch.testing.assert_close(twice(tokens()), masked_logits(model, union_LH, replacements), rtol=0, atol=1e-10)


def test_pruned_checkpoint_loads_through_both_loaders(tmp_path):
    model = make_model(torch.float32, combine="concat", out_bias=False, tie_embeddings=True)
    pruned = prune_heads(model, remove_masks()["layer_gone"], mean_replacements(model))
    path = tmp_path / "ablation" / "pruned.ckpt"
    meta = {"order": "gradient", "fraction": 0.5, "removed": [[1, 0], [1, 1]]}
    save_pruned_checkpoint(pruned, path, meta)
    assert [p.name for p in path.parent.iterdir()] == ["pruned.ckpt"]  # no temporary file left behind
    expected = pruned(tokens())
    loaded = load_model(path).eval()
    assert loaded.heads_per_layer == pruned.heads_per_layer and loaded.cfg.attn.out_bias
    assert torch.equal(loaded(tokens()), expected)
    module = HeadcountModule.load_from_checkpoint(path).eval()
    assert torch.equal(module.model(tokens()), expected)
    assert torch.load(path, weights_only=True)["headcount_pruned"] == meta


def test_pruned_checkpoint_cannot_be_unpruned():
    pruned = prune_heads(make_model(), remove_masks()["layer_gone"])
    assert pruned.heads_per_layer[1] == 0 and pruned.max_heads < H
    with pytest.raises(ConfigError, match="ablation.prune.heads.*cannot be un-pruned"):
        prune_heads(pruned, torch.zeros(L, H, dtype=torch.bool))  # the original model's shape
    names_a_gone_head_LH = torch.zeros(L, pruned.max_heads, dtype=torch.bool)
    names_a_gone_head_LH[1, 0] = True
    with pytest.raises(ConfigError, match=r"ablation.prune.heads=\[1, 0\].*cannot be un-pruned"):
        prune_heads(pruned, names_a_gone_head_LH)
    with pytest.raises(ConfigError, match="ablation.prune.heads.*bool"):
        prune_heads(pruned, torch.zeros(L, pruned.max_heads))


@pytest.mark.parametrize("replacement_shape", [(T, H, 4), (3, T, H, 4)], ids=["per_position_mean", "resample"])
def test_replacements_that_vary_cannot_fold_into_a_bias(replacement_shape):
    model = make_model()
    replacements = [torch.randn(replacement_shape, dtype=torch.float64)] * L
    with pytest.raises(ConfigError, match="ablation.mode.*position-averaged"):
        prune_heads(model, remove_masks()["random"], replacements)


def test_pruning_leaves_the_random_stream_alone():
    model = make_model()
    state = torch.get_rng_state()
    prune_heads(model, remove_masks()["random"])
    assert torch.equal(torch.get_rng_state(), state)


def test_measure_speed_reports_tokens_per_second_and_keeps_the_mode():
    model = make_model(torch.float32).train()
    full = measure_speed(model, batch_size=2, seq_len=T, device="cpu", repeats=2)
    pruned = measure_speed(prune_heads(model, remove_masks()["layer_gone"]), 2, T, "cpu", 2)
    assert full > 0 and pruned > 0
    assert model.training


# Every converted family, grouped-query models included: masked equals structurally pruned.

FAMILY_MASKS = {
    "whole_groups": torch.tensor([[True, True, False, False], [False, False, False, True]]),  # layer 0 loses a k/v head
    "random": torch.tensor([[False, True, True, False], [True, False, True, True]]),
}


@pytest.mark.parametrize("mode", ["zero", "mean"])
@pytest.mark.parametrize("mask", list(FAMILY_MASKS))
@pytest.mark.parametrize(
    "case",
    [
        "gpt2_tied",
        "llama_gqa_untied",
        "llama_mqa_tied_biases_wide_heads",
        "qwen2_gqa",
        "neox_parallel",
        "neox_sequential_tied",
    ],
)
def test_pruned_converted_family_equals_masked(case, mask, mode):
    pytest.importorskip("transformers")
    from pretrained_helpers import converted, tokens

    _, model = converted(case, torch.float64)
    remove_LH = FAMILY_MASKS[mask]
    g = torch.Generator().manual_seed(2)
    replacements = [torch.randn(4, model.head_dim, generator=g).double() for _ in range(2)] if mode == "mean" else None
    pruned = prune_heads(model, remove_LH, replacements)
    masked = model(tokens(), gated((~remove_LH).double(), replacements))
    torch.testing.assert_close(pruned(tokens()), masked, rtol=0, atol=1e-10)
    if model.cfg.attn.n_kv_heads is not None:  # a key/value head goes only with the last query head of its group
        kv_groups = model.blocks[0].attn.kv_groups
        assert pruned.blocks[0].attn.n_kv_heads == len(kv_groups) - (mask == "whole_groups" and kv_groups[0] == 2)
        assert sum(map(sum, pruned.cfg.kv_groups_per_layer)) == int((~remove_LH).sum())
    if mode == "mean":  # Llama and Qwen2 have no output bias: the folded means bring one
        assert pruned.cfg.attn.out_bias and all(block.attn.out.bias is not None for block in pruned.blocks)


def test_pruned_grouped_query_checkpoint_loads(tmp_path):
    pytest.importorskip("transformers")
    from pretrained_helpers import converted, tokens

    _, model = converted("llama_gqa_untied")
    pruned = prune_heads(model, FAMILY_MASKS["whole_groups"], [torch.randn(4, model.head_dim)] * 2)
    save_pruned_checkpoint(pruned, tmp_path / "pruned.ckpt", {"removed": [[0, 0], [0, 1], [1, 3]]})
    loaded = load_model(tmp_path / "pruned.ckpt").eval()
    assert loaded.cfg.kv_groups_per_layer == [[2], [2, 1]] and loaded.cfg.positions == "rotary"
    assert torch.equal(loaded(tokens()), pruned(tokens()))
