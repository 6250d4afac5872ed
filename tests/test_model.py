"""The docs/DESIGN.md invariants of the model, in float32 and float64, for both ways of combining heads."""

import pytest
import torch

from headcount.errors import ConfigError
from headcount.model import AttentionConfig, ModelConfig, Transformer

DTYPES = [torch.float32, torch.float64]
TOL = {torch.float32: 1e-5, torch.float64: 1e-12}


def make_model(dtype=torch.float64, seed=0, **attn) -> Transformer:
    torch.manual_seed(seed)
    attn_cfg = AttentionConfig(**{"n_heads": 4, **attn})
    cfg = ModelConfig(n_layers=2, d_model=32, n_ctx=16, vocab_size=50, attn=attn_cfg, mlp=True)
    return Transformer(cfg).to(dtype).eval()


def tokens(batch=3, T=12, seed=1) -> torch.Tensor:
    return torch.randint(0, 50, (batch, T), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("combine", ["concat", "sum"])
def test_all_gates_one_equals_no_gates_exactly(dtype, combine):
    model, x = make_model(dtype, combine=combine), tokens()
    plain = model(x)
    assert torch.equal(model(x, gates=torch.ones(2, 4, dtype=dtype)), plain)
    assert torch.equal(model(x, gates=torch.ones(3, 2, 4, dtype=dtype)), plain)
    replacement = [torch.randn(4, model.head_dim, dtype=dtype)] * 2
    assert torch.equal(model(x, gates=torch.ones(2, 4, dtype=dtype), replacements=replacement), plain)


@pytest.mark.parametrize("dtype", DTYPES)
def test_zeroed_head_equals_its_output_slice_zeroed(dtype):
    model, x = make_model(dtype), tokens()
    layer, head, D = 1, 2, model.head_dim
    gates = torch.ones(2, 4, dtype=dtype)
    gates[layer, head] = 0
    gated = model(x, gates=gates)
    with torch.no_grad():
        model.blocks[layer].attn.out.weight[:, head * D : (head + 1) * D] = 0
    torch.testing.assert_close(gated, model(x), rtol=0, atol=TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("combine", ["concat", "sum"])
def test_output_is_sum_of_per_head_contributions(dtype, combine):
    model, x = make_model(dtype, combine=combine), tokens()
    attn = model.blocks[0].attn
    h_BTC = model.blocks[0].ln_attn(model.embed(x))
    cache = {}
    out_BTC = attn(h_BTC, cache=cache)
    per_head_BTHC = torch.einsum("bthd,hdc->bthc", cache["z"], attn.W_O)
    torch.testing.assert_close(per_head_BTHC.sum(2) + attn.out.bias, out_BTC, rtol=0, atol=TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_sum_with_full_width_heads_is_the_literal_sum(dtype):
    model, x = make_model(dtype, combine="sum", head_dim=32), tokens()
    attn = model.blocks[0].attn
    assert attn.out.weight.shape == (32, 32)
    cache = {}
    out = attn(model.embed(x), cache=cache)
    torch.testing.assert_close(out, attn.out(cache["z"].sum(2)), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("combine", ["concat", "sum"])
def test_sdpa_fast_path_matches_reference_path(dtype, combine):
    model, x = make_model(dtype, combine=combine, head_dim=5), tokens()
    fast, slow = {}, {}
    logits_fast = model(x, cache=fast)
    logits_slow = model(x, cache=slow, need_patterns=True)
    torch.testing.assert_close(logits_fast, logits_slow, rtol=0, atol=TOL[dtype])
    for layer in range(2):
        torch.testing.assert_close(fast["z", layer], slow["z", layer], rtol=0, atol=TOL[dtype])
        pattern = slow["pattern", layer]
        assert pattern.shape == (3, 4, 12, 12)
        torch.testing.assert_close(pattern.sum(-1), torch.ones_like(pattern.sum(-1)))
        assert torch.all(pattern.triu(1) == 0)  # causal


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("combine", ["concat", "sum"])
def test_gate_blends_z_toward_replacement(dtype, combine):
    model, x = make_model(dtype, combine=combine), tokens()
    attn = model.blocks[0].attn
    h_BTC = model.blocks[0].ln_attn(model.embed(x))
    gate_H = torch.tensor([1.0, 0.25, 0.0, 0.5], dtype=dtype)
    r_HD = torch.randn(4, model.head_dim, dtype=dtype)
    cache = {}
    gated = attn(h_BTC, gate=gate_H, replacement=r_HD, cache=cache)
    g = gate_H.view(1, 1, 4, 1)
    blended_BTHD = g * cache["z"] + (1 - g) * r_HD
    per_head_BTHC = torch.einsum("bthd,hdc->bthc", blended_BTHD, attn.W_O)
    torch.testing.assert_close(gated, per_head_BTHC.sum(2) + attn.out.bias, rtol=0, atol=TOL[dtype])


def test_per_example_gates_equal_one_mask_per_forward():
    model, x = make_model(), tokens()
    gates = torch.rand(3, 2, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    batched = model(x, gates=gates)
    for i in range(3):
        torch.testing.assert_close(batched[i : i + 1], model(x[i : i + 1], gates=gates[i]), rtol=0, atol=1e-12)


def test_same_seed_same_numbers_bit_for_bit():
    a, b = make_model(torch.float32, seed=3), make_model(torch.float32, seed=3)
    assert torch.equal(a(tokens()), b(tokens()))
    assert not torch.equal(a(tokens()), make_model(torch.float32, seed=4)(tokens()))


def test_free_head_dim_grows_cost_and_flat_rule_keeps_it():
    flat = [make_model(n_heads=h).num_params() for h in (1, 2, 4)]
    assert len(set(flat)) == 1
    free = [make_model(n_heads=h, head_dim=16).num_params() for h in (1, 2, 4)]
    assert free[0] < free[1] < free[2]
    assert make_model(n_heads=4, head_dim=16).flops_per_token() > make_model(n_heads=1, head_dim=16).flops_per_token()


@pytest.mark.parametrize(
    "attn, key",
    [
        ({"n_heads": 0}, "model.attn.n_heads=0"),
        ({"n_heads": 5}, "model.attn.n_heads=5"),
        ({"n_heads": 4, "head_dim": 0}, "model.attn.head_dim=0"),
        ({"n_heads": 4, "combine": "mean"}, "model.attn.combine='mean'"),
    ],
)
def test_bad_attention_config_names_key_and_value(attn, key):
    with pytest.raises(ConfigError, match=key.replace("[", r"\[")) as err:
        Transformer(ModelConfig(d_model=32, attn=AttentionConfig(**attn)))
    assert "\n" not in str(err.value)


def test_non_divisible_width_is_fine_with_explicit_head_dim():
    model = Transformer(ModelConfig(d_model=32, attn=AttentionConfig(n_heads=5, head_dim=7)))
    assert model.blocks[0].attn.out.weight.shape == (32, 35)


@pytest.mark.parametrize("shape", [(2, 3), (4, 2, 4), (2, 4, 1)])
def test_gate_of_wrong_shape_is_refused(shape):
    with pytest.raises(ConfigError, match="gates"):
        make_model()(tokens(), gates=torch.ones(shape, dtype=torch.float64))


@pytest.mark.parametrize("value", [-0.1, 1.5, float("nan")])
def test_gate_outside_unit_interval_is_refused(value):
    gates = torch.ones(2, 4, dtype=torch.float64)
    gates[0, 1] = value
    with pytest.raises(ConfigError, match=r"\[0, 1\]"):
        make_model()(tokens(), gates=gates)


def test_sequence_longer_than_context_is_refused():
    with pytest.raises(ConfigError, match="data.seq_len=17.*n_ctx=16"):
        make_model()(tokens(T=17))


def test_gates_under_compile_do_not_recompile_per_mask():
    torch._dynamo.reset()
    model, x = make_model(torch.float32), tokens()
    compiled = torch.compile(model, backend="eager", dynamic=False)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for head in range(4):
            gates = torch.ones(2, 4)
            gates[1, head] = 0
            torch.testing.assert_close(compiled(x, gates=gates), model(x, gates=gates))


# The per-head API: every operation on heads lives in MultiHeadAttention, and Block.forward is heads -> gate -> finish.


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("combine", ["concat", "sum"])
def test_per_head_weight_views_reproduce_the_layer(dtype, combine):
    model, x = make_model(dtype, combine=combine, head_dim=6), tokens()
    attn = model.blocks[0].attn
    h_BTC = model.blocks[0].ln_attn(model.embed(x))
    q_BHTD, k_BHTD, v_BHTD = (
        torch.einsum("btc,hcd->bhtd", h_BTC, W) + b[:, None]
        for W, b in [(attn.W_Q, attn.b_Q), (attn.W_K, attn.b_K), (attn.W_V, attn.b_V)]
    )
    assert attn.W_Q.shape == (4, 32, 6) and attn.W_O.shape == (4, 6, 32) and attn.b_Q.shape == (4, 6)
    T = x.shape[1]
    scores_BHTT = (q_BHTD @ k_BHTD.transpose(-2, -1)) / 6**0.5
    scores_BHTT = scores_BHTT.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    z_BHTD = scores_BHTT.softmax(-1) @ v_BHTD
    out_BTC = torch.einsum("bhtd,hdc->btc", z_BHTD, attn.W_O) + attn.b_O
    torch.testing.assert_close(out_BTC, attn(h_BTC), rtol=0, atol=TOL[dtype])


def test_per_head_views_share_the_parameters():
    attn = make_model(combine="concat").blocks[0].attn
    with torch.no_grad():
        attn.W_V[2] += 1.0
        attn.W_O[1] *= 0
    D = attn.head_dim
    assert torch.all(attn.qkv.weight[2 * 4 * D + 2 * D : 2 * 4 * D + 3 * D] > 0.5)
    assert torch.all(attn.out.weight[:, D : 2 * D] == 0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("combine", ["concat", "sum"])
@pytest.mark.parametrize("mlp", [True, False])
def test_block_finish_from_z_equals_block_forward(dtype, combine, mlp):
    torch.manual_seed(0)
    cfg = ModelConfig(
        n_layers=2, d_model=32, n_ctx=16, vocab_size=50, mlp=mlp, attn=AttentionConfig(n_heads=4, combine=combine)
    )
    model, x = Transformer(cfg).to(dtype).eval(), tokens()
    block, resid_BTC = model.blocks[1], model.embed(x)
    cache = {}
    plain = block(resid_BTC, cache=cache)
    assert torch.equal(block.finish(resid_BTC, cache["z"]), plain)
    gate_BH = torch.rand(3, 4, dtype=dtype, generator=torch.Generator().manual_seed(0))
    r_HD = torch.randn(4, model.head_dim, dtype=dtype)
    gated = block.finish(resid_BTC, block.attn.gate_z(cache["z"], gate_BH, r_HD))
    assert torch.equal(gated, block(resid_BTC, gate_BH, r_HD))
    assert block.attn.gate_z(cache["z"], None) is cache["z"]


def test_forward_layers_starts_at_any_layer():
    model, x = make_model(), tokens()
    gates = torch.rand(3, 2, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    gates[:, 0] = 1
    cache = {}
    full = model.forward_layers(model.embed(x), 0, gates, cache=cache)
    assert torch.equal(model.forward_layers(cache["resid_pre", 1], 1, gates), full)


def removal_cases() -> dict[str, torch.Tensor]:
    return {
        "some": torch.tensor([True, False, True, False]),
        "all_but_one": torch.tensor([False, False, True, False]),
        "none": torch.zeros(4, dtype=torch.bool),
        "all": torch.ones(4, dtype=torch.bool),
    }


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("combine", ["concat", "sum"])
@pytest.mark.parametrize("out_bias", [True, False])
@pytest.mark.parametrize("mode", ["zero", "mean"])
@pytest.mark.parametrize("case", list(removal_cases()))
def test_attention_select_heads_equals_masking(dtype, combine, out_bias, mode, case):
    model, x = make_model(dtype, combine=combine, out_bias=out_bias), tokens()
    attn, keep_H = model.blocks[0].attn, removal_cases()[case]
    h_BTC = model.blocks[0].ln_attn(model.embed(x))
    r_HD = torch.randn(4, model.head_dim, dtype=dtype) if mode == "mean" else None
    state = torch.get_rng_state()
    selected = attn.select_heads(keep_H, r_HD)
    assert torch.equal(torch.get_rng_state(), state)  # the caller's random stream is left alone
    assert selected.n_heads == int(keep_H.sum()) and selected.qkv.weight.dtype == dtype
    assert (selected.out.bias is not None) == (out_bias or (mode == "mean" and not keep_H.all()))
    masked = attn(h_BTC, gate=keep_H.to(dtype), replacement=r_HD)
    torch.testing.assert_close(selected(h_BTC), masked, rtol=0, atol=TOL[dtype])
    with torch.no_grad():  # the new module owns its weights
        attn.qkv.weight.zero_()
        attn.out.weight.zero_()
    torch.testing.assert_close(selected(h_BTC), masked, rtol=0, atol=TOL[dtype])


def test_select_heads_can_add_a_zero_out_bias():
    attn = make_model(out_bias=False).blocks[0].attn
    selected = attn.select_heads(torch.tensor([True, False, True, True]), add_out_bias=True)
    assert torch.equal(selected.out.bias, torch.zeros(32, dtype=torch.float64))


def test_model_select_heads_records_heads_per_layer():
    model = make_model()
    keep_LH = torch.tensor([[True, False, True, True], [False, False, False, False]])
    selected = model.select_heads(keep_LH)
    assert selected.heads_per_layer == selected.cfg.heads_per_layer == [3, 0]
    assert model.cfg.heads_per_layer is None  # the original is untouched
    gates = keep_LH.double()
    torch.testing.assert_close(selected(tokens()), model(tokens(), gates=gates), rtol=0, atol=1e-12)


def test_activation_floats_count_the_widest_layer():
    model = make_model()  # C = 32, H = 4, D = 8, MLP hidden 128, vocab 50
    sizes = model.activation_floats(seq_len=12)
    assert (sizes.resid, sizes.z, sizes.logits) == (32, 32, 50)
    assert sizes.layer == 4 * 32 + 6 * 32 + 4 * 12 + 2 * 128
    pruned = model.select_heads(torch.tensor([[True, False, False, False], [True, True, False, False]]))
    assert pruned.activation_floats(12).z == 2 * 8
