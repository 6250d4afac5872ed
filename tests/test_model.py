"""The docs/DESIGN.md invariants of the model, in float32 and float64, for both ways of combining heads."""

import pytest
import torch

from headcount.config.model import RopeScalingConfig
from headcount.errors import ConfigError
from headcount.model import AttentionConfig, ModelConfig, Transformer
from headcount.model.intervention import gated, reads

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
    assert torch.equal(model(x, gated(torch.ones(2, 4, dtype=dtype))), plain)
    assert torch.equal(model(x, gated(torch.ones(3, 2, 4, dtype=dtype))), plain)
    replacement = [torch.randn(4, model.head_dim, dtype=dtype)] * 2
    assert torch.equal(model(x, gated(torch.ones(2, 4, dtype=dtype), replacement)), plain)


@pytest.mark.parametrize("dtype", DTYPES)
def test_zeroed_head_equals_its_output_slice_zeroed(dtype):
    model, x = make_model(dtype), tokens()
    layer, head, D = 1, 2, model.head_dim
    gates = torch.ones(2, 4, dtype=dtype)
    gates[layer, head] = 0
    ablated = model(x, gated(gates))
    with torch.no_grad():
        model.blocks[layer].attn.out.weight[:, head * D : (head + 1) * D] = 0
    torch.testing.assert_close(ablated, model(x), rtol=0, atol=TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("combine", ["concat", "sum"])
def test_output_is_sum_of_per_head_contributions(dtype, combine):
    model, x = make_model(dtype, combine=combine), tokens()
    attn = model.blocks[0].attn
    h_BTC = model.blocks[0].ln_attn(model.embed(x))
    out_BTC = attn(h_BTC)
    per_head_BTHC = torch.einsum("bthd,hdc->bthc", attn.heads(h_BTC), attn.W_O)
    torch.testing.assert_close(per_head_BTHC.sum(2) + attn.out.bias, out_BTC, rtol=0, atol=TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_sum_with_full_width_heads_is_the_literal_sum(dtype):
    model, x = make_model(dtype, combine="sum", head_dim=32), tokens()
    attn = model.blocks[0].attn
    assert attn.out.weight.shape == (32, 32)
    out = attn(model.embed(x))
    torch.testing.assert_close(out, attn.out(attn.heads(model.embed(x)).sum(2)), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("combine", ["concat", "sum"])
def test_sdpa_fast_path_matches_reference_path(dtype, combine):
    model, x = make_model(dtype, combine=combine, head_dim=5), tokens()
    fast, slow = reads(["attn.z"], range(2)), reads(["attn.z", "attn.pattern"], range(2))
    logits_fast = model(x, fast)
    logits_slow = model(x, slow)  # the pattern's site: the explicit path
    torch.testing.assert_close(logits_fast, logits_slow, rtol=0, atol=TOL[dtype])
    for layer in range(2):
        torch.testing.assert_close(fast.read("attn.z", layer), slow.read("attn.z", layer), rtol=0, atol=TOL[dtype])
        pattern = slow.read("attn.pattern", layer)
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
    blended = attn(h_BTC, gate=gate_H, replacement=r_HD)
    g = gate_H.view(1, 1, 4, 1)
    blended_BTHD = g * attn.heads(h_BTC) + (1 - g) * r_HD
    per_head_BTHC = torch.einsum("bthd,hdc->bthc", blended_BTHD, attn.W_O)
    torch.testing.assert_close(blended, per_head_BTHC.sum(2) + attn.out.bias, rtol=0, atol=TOL[dtype])


def test_per_example_gates_equal_one_mask_per_forward():
    model, x = make_model(), tokens()
    gates = torch.rand(3, 2, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    batched = model(x, gated(gates))
    for i in range(3):
        torch.testing.assert_close(batched[i : i + 1], model(x[i : i + 1], gated(gates[i])), rtol=0, atol=1e-12)


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
        make_model()(tokens(), gated(torch.ones(shape, dtype=torch.float64)))


@pytest.mark.parametrize("value", [-0.1, 1.5, float("nan")])
def test_gate_outside_unit_interval_is_refused(value):
    gates = torch.ones(2, 4, dtype=torch.float64)
    gates[0, 1] = value
    with pytest.raises(ConfigError, match=r"\[0, 1\]"):
        make_model()(tokens(), gated(gates))


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
            torch.testing.assert_close(compiled(x, gated(gates)), model(x, gated(gates)))


# The per-head API: every operation on heads lives in MultiHeadAttention, and Block.forward is heads -> finish, gates a
# hook at attn.z between them.


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
    z_BTHD = block.attn.heads(block.ln_attn(resid_BTC))
    assert torch.equal(block.finish(resid_BTC, z_BTHD), block(resid_BTC))
    gates_BLH = torch.rand(3, 2, 4, dtype=dtype, generator=torch.Generator().manual_seed(0))
    r_HD = torch.randn(4, model.head_dim, dtype=dtype)
    finished = block.finish(resid_BTC, block.attn.gate_z(z_BTHD, gates_BLH[:, 1], r_HD))
    assert torch.equal(finished, block(resid_BTC, gated(gates_BLH, [r_HD] * 2)))
    assert block.attn.gate_z(z_BTHD, None) is z_BTHD


def test_forward_layers_starts_at_any_layer():
    model, x = make_model(), tokens()
    gates = torch.rand(3, 2, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    gates[:, 0] = 1
    read = gated(gates, cache=["blocks.1.resid_pre"])
    full = model.forward_layers(model.embed(x), 0, read)
    assert torch.equal(model.forward_layers(read.read("resid_pre", 1), 1, gated(gates)), full)


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
    torch.testing.assert_close(selected(tokens()), model(tokens(), gated(gates)), rtol=0, atol=1e-12)


def test_activation_floats_count_the_widest_layer():
    model = make_model()  # C = 32, H = 4, D = 8, MLP hidden 128, vocab 50
    sizes = model.activation_floats(seq_len=12)
    assert (sizes.resid, sizes.z, sizes.logits) == (32, 32, 50)
    assert sizes.layer == 4 * 32 + 6 * 32 + 4 * 12 + 2 * 128
    pruned = model.select_heads(torch.tensor([[True, False, False, False], [True, True, False, False]]))
    assert pruned.activation_floats(12).z == 2 * 8


# Model families: every part a family can have keeps the invariants above, alone and together.

FEATURES = {
    "rotary": {"positions": "rotary"},
    "rotary_partial": {"positions": "rotary", "rotary_fraction": 0.5, "rotary_theta": 500.0},
    "shortformer": {"positions": "shortformer"},
    "shortformer_gqa": {"positions": "shortformer", "attn": {"n_kv_heads": 2}},
    "rmsnorm_swiglu": {"norm": "rmsnorm", "norm_eps": 1e-6, "mlp_act": "swiglu", "mlp_hidden": 40},
    "gqa": {"attn": {"n_kv_heads": 2}},
    "mqa_rotary": {"positions": "rotary", "attn": {"n_kv_heads": 1}},
    "parallel_tanh_no_biases": {
        "parallel_residual": True,
        "mlp_act": "gelu_tanh",
        "mlp_bias": False,
        "attn": {"qkv_bias": False, "out_bias": False},
    },
    "llama_like": {
        "positions": "rotary",
        "norm": "rmsnorm",
        "mlp_act": "swiglu",
        "mlp_bias": False,
        "tie_embeddings": True,
        "attn": {"n_kv_heads": 2, "qkv_bias": False, "out_bias": False},
    },
    # Gemma 3's parts: sandwich norms of Gemma's (1 + w) form, per-head q/k norms, GeGLU, embeddings scaled by
    # sqrt(d_model), the query scale, a sliding window shorter than the sequence on alternate layers, a local rotary
    # base on the sliding layers and a linear scaling on the full ones
    "gemma3_like": {
        "positions": "rotary",
        "norm": "rmsnorm_plus_one",
        "post_norm": True,
        "qk_norm": "head",
        "mlp_act": "geglu_tanh",
        "embed_scale": True,
        "sliding_window": 5,
        "layer_types": ["sliding", "full"],
        "rotary_theta_local": 50.0,
        "rope_scaling": RopeScalingConfig(type="linear", factor=4.0),
        "attn": {"n_kv_heads": 2, "query_pre_attn_scalar": 20.0},
    },
    "softcaps_window_everywhere": {"attn": {"softcap": 1.5}, "final_softcap": 2.0, "sliding_window": 3},
    "olmo2_like": {
        "positions": "rotary",
        "norm": "rmsnorm",
        "pre_norm": False,
        "post_norm": True,
        "qk_norm": "projection",
    },
    "rope_llama3": {
        "positions": "rotary",
        "rope_scaling": RopeScalingConfig(type="llama3", factor=4.0, original_n_ctx=8),
    },
    "rope_yarn": {"positions": "rotary", "rope_scaling": RopeScalingConfig(type="yarn", factor=4.0, original_n_ctx=8)},
    # dynamic NTK acts on sequences longer than original_n_ctx: the tests' 12 positions
    "rope_dynamic": {
        "positions": "rotary",
        "rope_scaling": RopeScalingConfig(type="dynamic", factor=2.0, original_n_ctx=8),
    },
}


def family_model(feature: str, dtype=torch.float64, seed=0, combine="concat") -> Transformer:
    torch.manual_seed(seed)
    settings = dict(FEATURES[feature])
    attn_cfg = AttentionConfig(**{"n_heads": 4, "combine": combine, **settings.pop("attn", {})})
    cfg = ModelConfig(n_layers=2, d_model=32, n_ctx=16, vocab_size=50, attn=attn_cfg, mlp=True, **settings)
    model = Transformer(cfg).to(dtype).eval()
    with torch.no_grad():  # weights larger than the init's (norm weights too), so every part shows in the logits
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    return model


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("feature", list(FEATURES))
def test_families_keep_the_invariants(feature, dtype):
    model, x = family_model(feature, dtype), tokens()
    plain = model(x)
    assert torch.equal(model(x, gated(torch.ones(3, 2, 4, dtype=dtype))), plain)
    fast, slow = reads(["attn.z"], range(2)), reads(["attn.z", "attn.pattern"], range(2))
    torch.testing.assert_close(model(x, slow), model(x, fast), rtol=0, atol=TOL[dtype])
    for layer in range(2):
        torch.testing.assert_close(fast.read("attn.z", layer), slow.read("attn.z", layer), rtol=0, atol=TOL[dtype])
        assert torch.all(slow.read("attn.pattern", layer).triu(1) == 0)
        window = model.blocks[layer].attn.features.window
        if window is not None:  # nothing window or more steps back
            assert torch.all(slow.read("attn.pattern", layer).tril(-window) == 0) and window < x.shape[1]
    layer, head, D = 1, 2, model.head_dim
    gates = torch.ones(2, 4, dtype=dtype)
    gates[layer, head] = 0
    ablated = model(x, gated(gates))
    assert not torch.allclose(ablated, plain, atol=1e-3)
    with torch.no_grad():
        model.blocks[layer].attn.out.weight[:, head * D : (head + 1) * D] = 0
    torch.testing.assert_close(ablated, model(x), rtol=0, atol=TOL[dtype])


@pytest.mark.parametrize("feature", list(FEATURES))
def test_families_finish_from_z_and_start_at_any_layer(feature):
    model, x = family_model(feature), tokens()
    read = reads(["resid_pre", "attn.z"], [1])
    full = model.forward_layers(model.embed(x), 0, read)
    block = model.blocks[1]
    assert torch.equal(block.finish(read.read("resid_pre", 1), read.read("attn.z", 1)), full)
    assert torch.equal(model.forward_layers(read.read("resid_pre", 1), 1), full)


@pytest.mark.parametrize("feature", ["gqa", "mqa_rotary", "llama_like"])
def test_grouped_query_per_head_views_reproduce_the_layer(feature):
    model, x = family_model(feature), tokens()
    attn = model.blocks[0].attn
    G = model.cfg.attn.n_kv_heads
    assert attn.W_Q.shape == (4, 32, 8) and attn.W_K.shape == attn.W_V.shape == (G, 32, 8)
    assert attn.kv_head_of.tolist() == [h * G // 4 for h in range(4)]
    h_BTC = model.blocks[0].ln_attn(model.embed(x))

    def per_head(W, b):
        out = torch.einsum("btc,hcd->bhtd", h_BTC, W)
        return out if b is None else out + b[:, None]

    q_BHTD, k_BGTD = per_head(attn.W_Q, attn.b_Q), per_head(attn.W_K, attn.b_K)
    v_BGTD = per_head(attn.W_V, attn.b_V)
    if attn.rotary is not None:
        q_BHTD, k_BGTD = attn.rotary(q_BHTD, k_BGTD)
    k_BHTD, v_BHTD = k_BGTD[:, attn.kv_head_of], v_BGTD[:, attn.kv_head_of]
    T = x.shape[1]
    scores_BHTT = (q_BHTD @ k_BHTD.transpose(-2, -1)) / 8**0.5
    scores_BHTT = scores_BHTT.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    out_BTC = torch.einsum("bhtd,hdc->btc", scores_BHTT.softmax(-1) @ v_BHTD, attn.W_O)
    if attn.b_O is not None:
        out_BTC = out_BTC + attn.b_O
    torch.testing.assert_close(out_BTC, attn(h_BTC), rtol=0, atol=1e-12)


def test_rotary_turns_dimension_pairs_by_position():
    """Rotary positions make q.k depend on the offset between positions only, on the rotating dimensions."""
    model = family_model("rotary_partial")
    rotary = model.blocks[0].attn.rotary
    assert (rotary.dims, rotary.theta) == (4, 500.0)
    q_11TD = torch.randn(1, 1, 1, 8, dtype=torch.float64).expand(1, 1, 10, 8)
    k_11TD = torch.randn(1, 1, 1, 8, dtype=torch.float64).expand(1, 1, 10, 8)
    q_rot, k_rot = rotary(q_11TD, k_11TD)
    assert torch.equal(q_rot[..., 4:], q_11TD[..., 4:])  # the other dimensions pass through
    dots_TT = (q_rot @ k_rot.transpose(-2, -1))[0, 0]
    torch.testing.assert_close(dots_TT.diagonal(0), dots_TT.diagonal(0)[:1].expand(10), atol=1e-6, rtol=0)
    torch.testing.assert_close(dots_TT.diagonal(-3), dots_TT.diagonal(-3)[:1].expand(7), atol=1e-6, rtol=0)
    assert torch.equal(q_rot[..., 0, :], q_11TD[..., 0, :])  # position 0 does not turn


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("feature", ["shortformer", "shortformer_gqa"])
def test_shortformer_positions_enter_queries_and_keys_only(feature, dtype):
    """q_h = (x + p_t) W_Q^h + b_Q and k_h = (x + p_t) W_K^h + b_K with the layer's own table p, v_h = x W_V^h + b_V
    without it; the stream gets no positions (embed is the token embedding), so a head that attends to one key
    alone, wherever it sits, writes the same vector at every position."""
    model, x = family_model(feature, dtype), tokens()
    assert model.pos_emb is None and torch.equal(model.embed(x), model.tok_emb(x))
    attn = model.blocks[1].attn
    h_BTC = torch.randn(3, 12, 32, dtype=dtype)
    q_BHTD, k_BGTD, v_BGTD = attn.project(h_BTC)
    p_TC = attn.pos_emb.weight[:12]
    by_hand = [
        torch.einsum("btc,hcd->bhtd", inputs, W) + b[None, :, None]
        for inputs, W, b in (
            (h_BTC + p_TC, attn.W_Q, attn.b_Q),
            (h_BTC + p_TC, attn.W_K, attn.b_K),
            (h_BTC, attn.W_V, attn.b_V),
        )
    ]
    for ours, theirs in zip((q_BHTD, k_BGTD, v_BGTD), by_hand):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=TOL[dtype])
    assert not torch.equal(model.blocks[0].attn.pos_emb.weight, attn.pos_emb.weight)  # a table per layer
    # The same token everywhere: without positions every head's z would be that token's value at every position;
    # with them the pattern moves but z is still a mean of equal values, so the logits are the same everywhere.
    same_BT = torch.full((1, 12), 7)
    logits_BTV = model(same_BT)
    torch.testing.assert_close(logits_BTV, logits_BTV[:, :1].expand_as(logits_BTV), rtol=0, atol=TOL[dtype] * 100)
    patterns = reads(["attn.pattern"], [0])
    model(same_BT, patterns)
    uniform = torch.full((6,), 1 / 6, dtype=dtype)
    assert not torch.allclose(patterns.read("attn.pattern", 0)[0, 0, 5, :6], uniform, atol=1e-3)


def test_grouped_query_attention_shares_key_value_weights():
    grouped, full = family_model("gqa"), make_model(n_heads=4)
    # Each of 2 layers drops 2 of its 4 key heads and 2 of its 4 value heads, each 8 wide with a bias.
    assert grouped.num_params() == full.num_params() - 2 * 2 * 2 * (8 * 32 + 8)
    assert grouped.blocks[0].attn.qkv.weight.shape == ((4 + 2 * 2) * 8, 32)


def group_removal_cases() -> dict[str, torch.Tensor]:
    return {
        "one_of_a_group": torch.tensor([True, False, True, True]),  # its key/value head stays for the other
        "a_whole_group": torch.tensor([False, False, True, True]),  # its key/value head goes
        "one_per_group": torch.tensor([False, True, True, False]),
        "all": torch.zeros(4, dtype=torch.bool),
    }


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("feature", ["gqa", "mqa_rotary", "llama_like"])
@pytest.mark.parametrize("mode", ["zero", "mean"])
@pytest.mark.parametrize("case", list(group_removal_cases()))
def test_grouped_select_heads_drops_a_key_value_head_with_its_last_query_head(dtype, feature, mode, case):
    model, x = family_model(feature, dtype), tokens()
    attn, keep_H = model.blocks[0].attn, group_removal_cases()[case]
    h_BTC = model.blocks[0].ln_attn(model.embed(x))
    r_HD = torch.randn(4, model.head_dim, dtype=dtype) if mode == "mean" else None
    selected = attn.select_heads(keep_H, r_HD)
    kept_groups = [int(keep_H[attn.kv_head_of == g].sum()) for g in range(attn.n_kv_heads)]
    assert selected.kv_groups == [n for n in kept_groups if n]
    assert selected.W_K.shape[0] == selected.n_kv_heads == sum(1 for n in kept_groups if n)
    masked = attn(h_BTC, gate=keep_H.to(dtype), replacement=r_HD)
    torch.testing.assert_close(selected(h_BTC), masked, rtol=0, atol=TOL[dtype])


def test_pruned_grouped_model_records_its_groups_and_rebuilds_from_its_config():
    model = family_model("llama_like")
    keep_LH = torch.tensor([[False, False, True, True], [True, False, False, True]])
    pruned = model.select_heads(keep_LH)
    assert pruned.cfg.heads_per_layer == [2, 2] and pruned.cfg.kv_groups_per_layer == [[2], [1, 1]]
    rebuilt = Transformer(pruned.cfg).double().eval()
    rebuilt.load_state_dict(pruned.state_dict())
    torch.testing.assert_close(rebuilt(tokens()), model(tokens(), gated(keep_LH.double())), rtol=0, atol=1e-12)
    # Ungrouped models keep today's config: no groups recorded.
    assert make_model().select_heads(keep_LH).cfg.kv_groups_per_layer is None


def test_activation_floats_count_shared_and_rotated_keys():
    plain, grouped, rotary = make_model(), family_model("gqa"), family_model("mqa_rotary")
    H, G, D, T = 4, 2, 8, 12
    base = 6 * H * D + H * T
    assert plain.blocks[0].attn.activation_floats(T) == base
    assert grouped.blocks[0].attn.activation_floats(T) == base + 2 * G * D
    assert rotary.blocks[0].attn.activation_floats(T) == base + 2 * 1 * D + 2 * H * D + 2 * 1 * D
    swiglu = family_model("rmsnorm_swiglu")
    assert swiglu.blocks[0].mlp.activation_floats() == 4 * 40


def test_default_model_keeps_its_checkpoint_names():
    model = Transformer(ModelConfig(mlp=True))
    block = ["ln_attn.weight", "ln_attn.bias", "attn.qkv.weight", "attn.qkv.bias", "attn.out.weight", "attn.out.bias"]
    block += ["ln_mlp.weight", "ln_mlp.bias", "mlp.fc.weight", "mlp.fc.bias", "mlp.proj.weight", "mlp.proj.bias"]
    names = ["tok_emb.weight", "pos_emb.weight", *(f"blocks.{i}.{n}" for i in range(2) for n in block)]
    assert list(model.state_dict()) == [*names, "ln_f.weight", "ln_f.bias", "lm_head.weight"]
    rotary = family_model("llama_like")
    assert rotary.pos_emb is None and "blocks.0.mlp.gate.weight" in rotary.state_dict()


@pytest.mark.parametrize(
    "settings, key",
    [
        ({"attn": AttentionConfig(n_heads=4, n_kv_heads=3)}, "model.attn.n_kv_heads=3"),
        ({"attn": AttentionConfig(n_heads=4, n_kv_heads=0)}, "model.attn.n_kv_heads=0"),
        ({"positions": "alibi"}, "model.positions='alibi'"),
        ({"norm": "batchnorm"}, "model.norm='batchnorm'"),
        ({"mlp_act": "relu"}, "model.mlp_act='relu'"),
        ({"positions": "rotary", "rotary_fraction": 0.0}, "model.rotary_fraction=0.0"),
        ({"positions": "rotary", "rotary_fraction": 1.5}, "model.rotary_fraction=1.5"),
        ({"positions": "rotary", "rotary_fraction": 0.125}, r"rotary_fraction=0.125.*fraction\) = 1"),
        ({"positions": "rotary", "rotary_theta": 0.0}, "model.rotary_theta=0.0"),
        ({"norm_eps": 0.0}, "model.norm_eps=0.0"),
        ({"mlp_hidden": 0}, "model.mlp_hidden=0"),
        ({"kv_groups_per_layer": [[2, 2], [3]]}, r"model.kv_groups_per_layer=\[\[2, 2\], \[3\]\]"),
        (
            {"attn": AttentionConfig(n_heads=4, n_kv_heads=2), "heads_per_layer": [4, 2]},
            "model.kv_groups_per_layer=None: is needed",
        ),
    ],
)
def test_bad_family_settings_name_key_and_value(settings, key):
    with pytest.raises(ConfigError, match=key) as err:
        Transformer(ModelConfig(d_model=32, **{"attn": AttentionConfig(n_heads=4), **settings}))
    assert "\n" not in str(err.value)


def test_family_settings_compose_from_the_command_line(compose_train):
    from hydra.errors import ConfigCompositionException
    from omegaconf import OmegaConf

    from headcount.config import validate_train_config

    overrides = ["model=tiny", "model.positions=rotary", "model.norm=rmsnorm", "model.mlp_act=swiglu"]
    cfg = compose_train([*overrides, "model.attn.n_kv_heads=2", "model.mlp_hidden=48", "model.parallel_residual=true"])
    validate_train_config(cfg)
    model = Transformer(OmegaConf.to_object(cfg.model))
    assert model.blocks[0].attn.n_kv_heads == 2 and model.blocks[0].mlp.gate.out_features == 48
    with pytest.raises(ConfigCompositionException) as err:  # refused when composed, naming the allowed values
        compose_train(["model.norm=batchnorm"])
    assert "expected one of [layernorm, rmsnorm, rmsnorm_plus_one]" in str(err.value.__cause__)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("feature", ["gemma3_like", "softcaps_window_everywhere", "rope_dynamic"])
def test_families_select_heads_equals_masking_and_rebuilds_from_its_config(feature, dtype):
    model = family_model(feature, dtype)
    keep_LH = torch.tensor([[False, True, True, True], [True, False, False, True]])
    pruned = model.select_heads(keep_LH)
    torch.testing.assert_close(pruned(tokens()), model(tokens(), gated(keep_LH.to(dtype))), rtol=0, atol=TOL[dtype])
    rebuilt = Transformer(pruned.cfg).to(dtype).eval()
    rebuilt.load_state_dict(pruned.state_dict())
    assert torch.equal(rebuilt(tokens()), pruned(tokens()))


def test_a_norm_over_the_whole_projection_cannot_be_pruned_structurally():
    model = family_model("olmo2_like")
    with pytest.raises(ConfigError, match="model.qk_norm='projection': cannot be pruned structurally") as err:
        model.select_heads(torch.tensor([[True, True, True, False], [True] * 4]))
    assert "\n" not in str(err.value)
    assert model.select_heads(torch.ones(2, 4, dtype=torch.bool)).cfg.heads_per_layer == [4, 4]  # nothing removed


def test_new_keys_default_to_the_old_model():
    """A checkpoint from before these keys (its hyperparameters lack them) rebuilds the same model: every default is
    the old behaviour, and the parameter names are the old ones."""
    from dataclasses import asdict

    from headcount.run_dir import model_config_from_dict

    new_keys = ["rope_scaling", "rotary_theta_local", "sliding_window", "layer_types", "qk_norm", "pre_norm"]
    new_keys += ["post_norm", "embed_scale", "final_softcap"]
    old = asdict(ModelConfig(n_layers=2, d_model=32, n_ctx=16, vocab_size=50, mlp=True, positions="rotary"))
    for key in new_keys:
        del old[key]
    del old["attn"]["query_pre_attn_scalar"], old["attn"]["softcap"]
    cfg = model_config_from_dict(old)
    assert cfg == ModelConfig(n_layers=2, d_model=32, n_ctx=16, vocab_size=50, mlp=True, positions="rotary")
    torch.manual_seed(0)
    model = Transformer(cfg).double().eval()
    assert list(model.state_dict()) == list(family_model("rotary_partial").state_dict())
    assert (cfg.sliding_window, cfg.layer_types, cfg.qk_norm, cfg.rope_scaling.type) == (None, None, "none", "default")
    assert cfg.pre_norm and not (cfg.post_norm or cfg.embed_scale) and cfg.final_softcap is None


@pytest.mark.parametrize(
    "settings, key",
    [
        ({"sliding_window": 0}, "model.sliding_window=0"),
        ({"layer_types": ["full", "local"]}, r"model.layer_types=\['full', 'local'\]: needs 2 entries.*full, sliding"),
        ({"layer_types": ["full", "sliding"]}, "model.sliding_window=None: must be set"),
        ({"qk_norm": "head"}, "model.qk_norm='head': needs an RMS norm"),
        ({"qk_norm": "layer"}, "model.qk_norm='layer'"),
        ({"rope_scaling": RopeScalingConfig(type="ntk")}, "model.rope_scaling.type='ntk'"),
        ({"rope_scaling": RopeScalingConfig(type="linear")}, "model.rope_scaling.type='linear': needs model.positions"),
        (
            {"positions": "rotary", "rope_scaling": RopeScalingConfig(type="linear", factor=0.5)},
            "model.rope_scaling.factor=0.5",
        ),
        (
            {"positions": "rotary", "rope_scaling": RopeScalingConfig(type="llama3", low_freq_factor=4.0)},
            "model.rope_scaling.low_freq_factor=4.0",
        ),
        ({"rotary_theta_local": -1.0}, "model.rotary_theta_local=-1.0"),
        ({"attn": AttentionConfig(n_heads=4, softcap=0.0)}, "model.attn.softcap=0.0"),
        ({"attn": AttentionConfig(n_heads=4, query_pre_attn_scalar=-2.0)}, "model.attn.query_pre_attn_scalar=-2.0"),
        ({"final_softcap": -1.0}, "model.final_softcap=-1.0"),
    ],
)
def test_bad_feature_settings_name_key_and_value(settings, key):
    with pytest.raises(ConfigError, match=key) as err:
        Transformer(ModelConfig(d_model=32, **{"attn": AttentionConfig(n_heads=4), **settings}))
    assert "\n" not in str(err.value)


def test_feature_settings_compose_from_the_command_line(compose_train):
    from omegaconf import OmegaConf

    from headcount.config import validate_train_config

    overrides = ["model=tiny", "model.positions=rotary", "model.norm=rmsnorm_plus_one", "model.mlp_act=geglu_tanh"]
    overrides += ["model.sliding_window=4", "model.layer_types=[sliding,full]", "model.qk_norm=head"]
    overrides += [
        "model.rope_scaling.type=llama3",
        "model.rope_scaling.factor=8",
        "model.rope_scaling.original_n_ctx=16",
    ]
    overrides += ["model.post_norm=true", "model.embed_scale=true", "model.attn.softcap=20", "model.final_softcap=30"]
    cfg = compose_train(overrides)
    validate_train_config(cfg)
    model = Transformer(OmegaConf.to_object(cfg.model))
    assert [b.attn.features.window for b in model.blocks] == [4, None]
    assert model.blocks[0].attn.rotary.scaling.type == "llama3" and model.lm_head.softcap == 30.0
