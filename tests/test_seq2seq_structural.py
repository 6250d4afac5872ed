"""Structural pruning of an encoder-decoder (EncoderDecoder.select_heads): the smaller model without the removed
heads of each kind (encoder self-attention, decoder self-attention, cross-attention) equals the full model with them
gated to 0 (zero ablation) or replaced by a constant per head folded into the output bias (mean ablation), in float32
and float64; its config records each kind's heads per layer, so its checkpoint rebuilds; the grid of a pruned model
has each layer's own head count; bad head counts are one line."""

import pytest
import torch

from headcount.ablation.methods.structural import save_pruned_checkpoint
from headcount.config import plain
from headcount.config.model import AttentionConfig, ModelConfig, validate_model_config
from headcount.errors import ConfigError
from headcount.model.encoder_decoder import EncoderDecoder
from headcount.run_dir import load_model, model_config_from_dict

DTYPES = [torch.float32, torch.float64]
TOL = {torch.float32: 2e-5, torch.float64: 1e-10}


def config(**changes) -> ModelConfig:
    settings = {
        "n_layers": 2,
        "encoder_layers": 3,
        "d_model": 24,
        "n_ctx": 16,
        "vocab_size": 30,
        "attn": AttentionConfig(n_heads=4, out_bias=False),
        "cross_attn": AttentionConfig(n_heads=3, head_dim=5, out_bias=False),
        "mlp": True,
    }
    return ModelConfig(**{**settings, **changes})


CONFIGS = {
    "concat_no_out_bias": config(),
    "post_ln_learned": config(pre_norm=False, post_ln=True, final_norm=False, embed_norm=True, logits_bias=True),
    "grouped_cross_sum": config(
        positions="rotary",
        cross_attn=AttentionConfig(n_heads=4, head_dim=6, n_kv_heads=2),
        attn=AttentionConfig(n_heads=4, combine="sum", n_kv_heads=2),
    ),
    # the relative bias has a row per head of model.attn: only cross-attention heads can go
    "relative_cross_only": config(positions="relative", relative_buckets=8, relative_max_distance=6),
}


def model_and_inputs(name: str, dtype: torch.dtype, seed: int = 0):
    torch.manual_seed(seed)
    model = EncoderDecoder(CONFIGS[name]).to(dtype).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.4)
    g = torch.Generator().manual_seed(seed + 1)
    return model, torch.randint(0, 30, (3, 11), generator=g), torch.randint(0, 30, (3, 7), generator=g)


def random_keep(model: EncoderDecoder, seed: int, kinds=("enc", "dec", "cross")) -> dict[str, torch.Tensor]:
    """Keep-masks by kind removing about half of each kind's heads, with one layer of each kind losing every head."""
    g = torch.Generator().manual_seed(seed)
    keep = {}
    for kind in kinds:
        layers, heads = model.head_kinds[kind]
        keep_LH = torch.rand(layers, heads, generator=g) > 0.5
        keep_LH[0] = False
        keep_LH[-1, 0] = True
        keep[kind] = keep_LH
    return keep


def constants(model: EncoderDecoder, dtype: torch.dtype, seed: int) -> dict[str, list[torch.Tensor]]:
    """A random constant z per head of every layer of every kind (what mean ablation's position-averaged means are)."""
    g = torch.Generator().manual_seed(seed)
    counts = model.kind_heads_per_layer
    return {
        kind: [torch.randn(n, model.attention(kind, layer).head_dim, generator=g).to(dtype) for layer, n in
               enumerate(counts[kind])]
        for kind in counts
    }  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("mode", ["zero", "mean"])
def test_the_pruned_model_equals_the_full_model_with_those_heads_gated_off(name, dtype, mode):
    model, src, tgt = model_and_inputs(name, dtype)
    kinds = ("cross",) if name == "relative_cross_only" else ("enc", "dec", "cross")
    keep = random_keep(model, seed=3, kinds=kinds)
    means = constants(model, dtype, seed=4) if mode == "mean" else None
    pruned = model.select_heads(keep, means)
    with torch.no_grad():
        gates = {kind: keep_LH.to(dtype) for kind, keep_LH in keep.items()}
        expected = model(src, tgt, gates=gates, replacements=means)
        got = pruned(src, tgt)
        assert (expected - model(src, tgt)).abs().max() > 1e-3  # the removed heads mattered
    torch.testing.assert_close(got, expected, rtol=0, atol=TOL[dtype])
    assert pruned.num_params() < model.num_params()
    assert next(pruned.parameters()).dtype == dtype and not pruned.training


@pytest.mark.parametrize("name", list(CONFIGS))
def test_the_config_records_each_kinds_kept_heads_and_the_checkpoint_rebuilds(name, tmp_path):
    model, src, tgt = model_and_inputs(name, torch.float64)
    kinds = ("cross",) if name == "relative_cross_only" else ("enc", "dec", "cross")
    keep = random_keep(model, seed=5, kinds=kinds)
    pruned = model.select_heads(keep, constants(model, torch.float64, seed=6))
    kept = {kind: keep_LH.sum(1).tolist() for kind, keep_LH in keep.items()}
    assert pruned.kind_heads_per_layer == {**model.kind_heads_per_layer, **kept}
    cfg = pruned.cfg
    assert cfg.cross_heads_per_layer == kept["cross"]
    if "enc" in kept:
        assert (cfg.encoder_heads_per_layer, cfg.heads_per_layer) == (kept["enc"], kept["dec"])
    else:  # a kind that lost no head keeps its config unset
        assert (cfg.encoder_heads_per_layer, cfg.heads_per_layer) == (None, None)
    # the grid of the pruned model: each row its own layer's heads, the kinds' widths their widest layer's
    grid = pruned.heads_per_layer
    assert list(grid) == [n for kind in ("enc", "dec", "cross") for n in pruned.kind_heads_per_layer[kind]]
    assert pruned.head_kinds["cross"] == (2, max(max(kept["cross"]), 1))
    rebuilt = EncoderDecoder(model_config_from_dict(plain(cfg))).double().eval()
    rebuilt.load_state_dict(pruned.state_dict())
    path = tmp_path / "pruned.ckpt"
    save_pruned_checkpoint(pruned, path, {"chosen_by": "test"})
    loaded = load_model(path)  # float32, as every checkpoint loads
    with torch.no_grad():
        torch.testing.assert_close(rebuilt(src, tgt), pruned(src, tgt), rtol=0, atol=0)
        torch.testing.assert_close(loaded(src, tgt), pruned.float()(src, tgt), rtol=0, atol=1e-5)


def test_grouped_key_value_heads_go_with_their_last_query_head_and_are_recorded():
    model, src, tgt = model_and_inputs("grouped_cross_sum", torch.float64)
    keep = {
        "enc": torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1], [0, 1, 0, 1]], dtype=torch.bool),
        "cross": torch.tensor([[1, 0, 0, 0], [1, 1, 1, 1]], dtype=torch.bool),
    }
    pruned = model.select_heads(keep)
    assert pruned.cfg.encoder_kv_groups_per_layer == [[2, 2], [2], [1, 1]]
    assert pruned.cfg.cross_kv_groups_per_layer == [[1], [2, 2]]
    assert pruned.cfg.kv_groups_per_layer is None and pruned.cfg.heads_per_layer is None  # decoder untouched
    assert pruned.decoder.blocks[0].cross.n_kv_heads == 1
    with torch.no_grad():
        expected = model(src, tgt, gates={kind: k.double() for kind, k in keep.items()})
        torch.testing.assert_close(pruned(src, tgt), expected, rtol=0, atol=1e-10)


def test_a_folded_replacement_gives_every_layer_of_its_kind_an_output_bias_and_no_other_kind():
    model, src, tgt = model_and_inputs("concat_no_out_bias", torch.float64)
    means = constants(model, torch.float64, seed=1)
    keep = {"enc": torch.ones(3, 4, dtype=torch.bool)}
    keep["enc"][1, 2] = False
    pruned = model.select_heads(keep, means)
    assert pruned.cfg.attn.out_bias and all(block.attn.out.bias is not None for block in pruned.decoder.blocks)
    assert not pruned.cfg.cross_attn.out_bias and pruned.decoder.blocks[0].cross.out.bias is None
    zero = model.select_heads(keep)
    assert not zero.cfg.attn.out_bias and zero.encoder.blocks[0].attn.out.bias is None
    cross_keep = {"cross": torch.tensor([[1, 1, 1], [1, 0, 1]], dtype=torch.bool)}
    cross = model.select_heads(cross_keep, means)
    assert cross.cfg.cross_attn.out_bias and not cross.cfg.attn.out_bias
    assert all(block.cross.out.bias is not None for block in cross.decoder.blocks)


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        ({"encoder_heads_per_layer": [4, 4]}, "model.encoder_heads_per_layer"),
        ({"cross_heads_per_layer": [3, -1]}, "model.cross_heads_per_layer"),
        ({"cross_kv_groups_per_layer": [[1, 1], [1, 1, 1]]}, "model.cross_kv_groups_per_layer"),
        ({"encoder_layers": 0, "cross_attn": None, "cross_heads_per_layer": [3, 3]}, "model.cross_heads_per_layer"),
        (
            {"cross_attn": AttentionConfig(n_heads=4, n_kv_heads=2), "cross_heads_per_layer": [4, 3]},
            "model.cross_kv_groups_per_layer",
        ),
        (
            {
                "positions": "relative",
                "relative_buckets": 8,
                "relative_max_distance": 6,
                "encoder_heads_per_layer": [4, 3, 4],
            },
            "model.encoder_heads_per_layer",
        ),  # fmt: skip
    ],
)
def test_bad_head_counts_are_one_line_naming_the_key(changes, key):
    with pytest.raises(ConfigError) as error:
        validate_model_config(config(**changes))
    assert str(error.value).startswith(key) and "\n" not in str(error.value)
