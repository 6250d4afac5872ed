"""The configurable encoder-decoder (model/encoder_decoder.py): the invariants of docs/DESIGN.md's contract for every
head kind (encoder self-attention, decoder self-attention, cross-attention), in float32 and float64; T5's buckets;
padding; the refusals of a cross-attention setting without an encoder and of a head kind a model lacks."""

import pytest
import torch

from headcount.config import validate_train_config
from headcount.config.model import AttentionConfig, ModelConfig
from headcount.errors import ConfigError
from headcount.model.attention import AttentionFeatures, MultiHeadAttention
from headcount.model.encoder_decoder import EncoderDecoder, build_model, gates_off, parse_head_of
from headcount.model.relative import RelativePositionBias, relative_bucket
from headcount.model.transformer import Transformer
from headcount.run_dir import model_config_from_dict

DTYPES = [torch.float32, torch.float64]
TOL = {torch.float32: 1e-5, torch.float64: 1e-12}


def config(**changes) -> ModelConfig:
    settings = {
        "n_layers": 2,
        "encoder_layers": 3,
        "d_model": 24,
        "n_ctx": 16,
        "vocab_size": 30,
        "attn": AttentionConfig(n_heads=4),
        "cross_attn": AttentionConfig(n_heads=3, head_dim=5, n_kv_heads=None),
        "mlp": True,
        "positions": "relative",
        "relative_buckets": 8,
        "relative_max_distance": 6,
    }
    return ModelConfig(**{**settings, **changes})


CONFIGS = {
    "t5_like": config(),
    "post_ln_learned": config(
        positions="learned",
        relative_buckets=32,
        relative_max_distance=128,
        pre_norm=False,
        post_ln=True,
        final_norm=False,
        embed_norm=True,
        embed_scale=True,
        logits_bias=True,
    ),
    "grouped_cross_sum": config(
        positions="rotary",
        relative_buckets=32,
        relative_max_distance=128,
        cross_attn=AttentionConfig(n_heads=4, head_dim=6, n_kv_heads=2),
        attn=AttentionConfig(n_heads=4, combine="sum", n_kv_heads=2),
    ),
}


def model_and_inputs(name: str, dtype: torch.dtype, seed: int = 0):
    torch.manual_seed(seed)
    model = EncoderDecoder(CONFIGS[name]).to(dtype).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.4)
    g = torch.Generator().manual_seed(seed + 1)
    return model, torch.randint(0, 30, (3, 11), generator=g), torch.randint(0, 30, (3, 7), generator=g)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(CONFIGS))
def test_all_gates_one_equals_no_gates_exactly_for_every_kind(name, dtype):
    model, src, tgt = model_and_inputs(name, dtype)
    with torch.no_grad():
        plain = model(src, tgt)
        gates = {kind: torch.ones(shape, dtype=dtype) for kind, shape in model.head_kinds.items()}
        assert torch.equal(model(src, tgt, gates=gates), plain)
        batched = {kind: torch.ones(3, *shape, dtype=dtype) for kind, shape in model.head_kinds.items()}
        assert torch.equal(model(src, tgt, gates=batched), plain)


def zero_slice(model: EncoderDecoder, kind: str, layer: int, head: int) -> EncoderDecoder:
    """A copy with head's rows of W_O zeroed (concat)."""
    other = EncoderDecoder(model.cfg).to(next(model.parameters()).dtype).eval()
    other.load_state_dict(model.state_dict())
    stack = other.encoder if kind == "enc" else other.decoder
    attn = stack.blocks[layer].cross if kind == "cross" else stack.blocks[layer].attn
    with torch.no_grad():
        attn.out.weight[:, head * attn.head_dim : (head + 1) * attn.head_dim] = 0
    return other


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ["t5_like", "post_ln_learned"])
def test_a_zeroed_head_of_each_kind_equals_its_slice_of_w_o_zeroed(name, dtype):
    model, src, tgt = model_and_inputs(name, dtype)
    with torch.no_grad():
        plain = model(src, tgt)
        for kind, (layers, heads) in model.head_kinds.items():
            for layer, head in [(0, 0), (layers - 1, heads - 1)]:
                gates = torch.ones(layers, heads, dtype=dtype)
                gates[layer, head] = 0
                got = model(src, tgt, gates={kind: gates})
                expected = zero_slice(model, kind, layer, head)(src, tgt)
                torch.testing.assert_close(got, expected, rtol=0, atol=TOL[dtype])
                assert (got - plain).abs().max() > 1e-4, f"{kind}.L{layer}H{head} changes nothing"


@pytest.mark.parametrize("dtype", DTYPES)
def test_per_example_gates_equal_one_mask_per_pass(dtype):
    model, src, tgt = model_and_inputs("grouped_cross_sum", dtype)
    masks = [["cross.L1H2"], ["enc.L0H0", "dec.L1H3"], []]
    with torch.no_grad():
        each = [gates_off(model, m, dtype=dtype) for m in masks]
        batched = {kind: torch.stack([g[kind] for g in each]) for kind in model.head_kinds}
        got = model(src, tgt, gates=batched)
        for i, gates in enumerate(each):
            torch.testing.assert_close(
                got[i], model(src[i : i + 1], tgt[i : i + 1], gates=gates)[0], rtol=0, atol=TOL[dtype]
            )


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_padded_source_scores_as_it_scores_alone(dtype):
    model, src, tgt = model_and_inputs("t5_like", dtype)
    keep = torch.ones_like(src, dtype=torch.bool)
    keep[0, 6:] = False
    keep[2, 9:] = False
    padded = src.masked_fill(~keep, 0)
    with torch.no_grad():
        got = model(padded, tgt, src_keep=keep)
        for i in range(3):
            alone = model(src[i : i + 1, : int(keep[i].sum())], tgt[i : i + 1])
            torch.testing.assert_close(got[i], alone[0], rtol=0, atol=TOL[dtype])
        assert (model(padded, tgt)[0] - got[0]).abs().max() > 1e-4  # without src_keep the padding is read


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [True, False])
def test_sdpa_with_a_bias_equals_the_reference_path(causal, dtype):
    torch.manual_seed(0)
    attn = MultiHeadAttention(16, 4, 4, features=AttentionFeatures(causal=causal)).to(dtype)
    q, k, v = (torch.randn(2, 4, 7, 4, dtype=dtype) for _ in range(3))
    bias = torch.randn(1, 4, 7, 7, dtype=dtype) + torch.zeros(2, 1, 1, 7, dtype=dtype).index_fill(
        3, torch.tensor([6]), float("-inf")
    )
    fast = attn.attend(q, k, v, bias=bias)
    reference, _ = attn.reference_attention(q, k, v, bias=bias)
    torch.testing.assert_close(fast, reference.transpose(1, 2), rtol=0, atol=TOL[dtype])


def test_buckets_equal_transformers_t5():
    t5 = pytest.importorskip("transformers").models.t5.modeling_t5.T5Attention
    distance = torch.arange(-300, 300)[None, :]
    for bidirectional in (True, False):
        for buckets, max_distance in ((32, 128), (8, 7), (8, 5), (6, 40)):
            theirs = t5._relative_position_bucket(distance, bidirectional, buckets, max_distance)
            assert torch.equal(relative_bucket(distance, bidirectional, buckets, max_distance), theirs)


def test_the_relative_bias_is_shared_by_the_layers_and_causal_in_the_decoder():
    model, src, tgt = model_and_inputs("t5_like", torch.float64)
    names = [n for n, _ in model.named_parameters() if "rel_emb" in n]
    assert names == ["encoder.rel_bias.rel_emb.weight", "decoder.rel_bias.rel_emb.weight"]
    assert model.encoder.rel_bias.bidirectional and not model.decoder.rel_bias.bidirectional
    bias = RelativePositionBias(2, 8, 6, bidirectional=False)
    with torch.no_grad():
        bias.rel_emb.weight.copy_(torch.arange(16.0).view(8, 2))
    values = bias(5)[0, 0]
    assert torch.equal(values.triu(1), torch.zeros(5, 5))  # future keys: bucket 0 (the causal mask hides them)
    assert values[4, 0] != values[4, 4]


def test_the_decoder_only_default_and_old_configs_are_unchanged():
    old = {"n_layers": 2, "d_model": 32, "attn": {"n_heads": 4}, "mlp": True}  # a checkpoint's dict before the keys
    cfg = model_config_from_dict(old)
    assert cfg.encoder_layers == 0 and cfg.cross_attn is None
    model = build_model(cfg)
    assert type(model) is Transformer
    assert not any("cross" in n or "rel_bias" in n for n in model.state_dict())


BAD = [
    ({"encoder_layers": 0}, "model.cross_attn='set': is the cross-attention of an encoder-decoder"),
    ({"encoder_layers": -1}, "model.encoder_layers=-1: must be 0 (decoder-only) or a positive integer"),
    ({"causal": False}, "model.causal=False: must be true in an encoder-decoder"),
    ({"relative_buckets": 2}, "model.relative_buckets=2: must be at least 2 (4 for bidirectional attention"),
    ({"relative_max_distance": 2}, "model.relative_max_distance=2: must exceed the exactly bucketed distances"),
    ({"cross_attn": AttentionConfig(n_heads=4, n_kv_heads=3)}, "model.cross_attn.n_kv_heads=3: must divide"),
    ({"cross_attn": AttentionConfig(n_heads=5)}, "model.cross_attn.n_heads=5: must divide model.d_model=24"),
    ({"type_vocab_size": 2}, "model.type_vocab_size=2: is not used with model.encoder_layers=3"),
]


@pytest.mark.parametrize(("changes", "message"), BAD, ids=[m.split(":")[0] for _, m in BAD])
def test_bad_settings_are_one_line(changes, message):
    with pytest.raises(ConfigError) as error:
        EncoderDecoder(config(**changes)) if changes.get("encoder_layers", 3) else Transformer(config(**changes))
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


def test_a_head_kind_the_model_lacks_is_one_line():
    decoder_only = Transformer(ModelConfig(n_layers=2, d_model=16, attn=AttentionConfig(n_heads=2)))
    encdec, _, _ = model_and_inputs("t5_like", torch.float32)
    cases = [
        (decoder_only, "cross.L0H1", "mask='cross.L0H1': names cross-attention heads, which this one-stack model"),
        (decoder_only, "enc.L0H1", "mask='enc.L0H1': names encoder self-attention heads, which this one-stack model"),
        (encdec, "L0H1", "mask='L0H1': an encoder-decoder's heads are named by kind: enc.L1H3, dec.L1H3 or cross.L1H3"),
        (encdec, "crosss.L0H1", "mask='crosss.L0H1': no such head kind; this encoder-decoder's: enc, dec, cross"),
        (encdec, "cross.L0H3", "mask='cross.L0H3': no such head: the last cross is cross.L1H2"),
        (encdec, "enc.L3H0", "mask='enc.L3H0': no such head: the last enc is enc.L2H3"),
    ]
    for model, label, message in cases:
        with pytest.raises(ConfigError) as error:
            parse_head_of(model, label)
        assert str(error.value).startswith(message), str(error.value)
    assert parse_head_of(encdec, "cross.L1H2") == ("cross", 1, 2)
    assert parse_head_of(decoder_only, "L1H1") == (None, 1, 1)
    with pytest.raises(ConfigError, match="gates='cros': no such head kind; allowed: enc, dec, cross"):
        encdec(torch.zeros(1, 3, dtype=torch.long), torch.zeros(1, 2, dtype=torch.long), gates={"cros": None})
    with pytest.raises(ConfigError, match=r"gates\['cross'\]=\(2, 4\): allowed shapes: \(2, 3\)"):
        encdec(
            torch.zeros(1, 3, dtype=torch.long), torch.zeros(1, 2, dtype=torch.long), gates={"cross": torch.ones(2, 4)}
        )


def test_a_scan_mask_naming_a_kind_is_refused_on_a_one_stack_model():
    from headcount.ablation.engine.masks import requested_mask

    with pytest.raises(ConfigError) as error:
        requested_mask(None, "cross.L0H1+L1H0", [4, 4], "ablation.masks", [])
    message = str(error.value)
    assert message.startswith("ablation.masks='cross.L0H1': names cross-attention heads, which this one-stack model")
    assert "\n" not in message


def test_the_cache_names_activations_by_site_and_kind():
    from headcount.model.sites import parse_stack_site

    model, src, tgt = model_and_inputs("t5_like", torch.float64)
    gates = gates_off(model, ["cross.L1H2", "enc.L0H3"], dtype=torch.float64)
    cache = {}
    with torch.no_grad():
        model(src, tgt, gates=gates, cache=cache)
    assert cache["dec.blocks.1.cross.z"].shape == (3, 7, 3, 5)
    assert torch.equal(cache["dec.blocks.1.cross.z"][:, :, 2], torch.zeros(3, 7, 5, dtype=torch.float64))
    assert torch.equal(cache["enc.blocks.0.attn.z"][:, :, 3], torch.zeros(3, 11, 6, dtype=torch.float64))
    assert cache["dec.blocks.0.attn.z"].shape == (3, 7, 4, 6) and cache["enc.out"].shape == (3, 11, 24)
    for name in cache:
        stack, site = parse_stack_site(name)
        assert name.startswith(stack) and (site.layer is None) == (name == "enc.out")
    with pytest.raises(ConfigError, match="hooks.site='enc.blocks.0.cross.z': allowed: enc.embed, enc.out"):
        parse_stack_site("enc.blocks.0.cross.z")


def test_training_preflight_builds_an_encoder_decoder_checks_its_scans_and_refuses_a_one_stack_scan_in_one_line():
    from omegaconf import OmegaConf

    from headcount.ablation.session import typed_ablation
    from headcount.cli.preflight import check_ablation, check_fits_in_memory, model_on_meta

    trainer = OmegaConf.create({"precision": "32-true", "accelerator": "cpu", "devices": 1, "num_nodes": 1})
    model = model_on_meta(config(), trainer)
    assert isinstance(model, EncoderDecoder) and next(model.parameters()).is_meta
    check_fits_in_memory(model, trainer)
    check_ablation(typed_ablation(OmegaConf.create({"scans": {"s": {"kind": "single_head"}}})), model)
    with pytest.raises(ConfigError) as error:
        check_ablation(typed_ablation(OmegaConf.create({"scans": {"e": {"kind": "edge_attribution"}}})), model)
    assert str(error.value).startswith(
        "ablation.scans.e.kind='edge_attribution': the scan is not defined through cross-attention yet; an "
        "encoder-decoder's exact, EAP and EAP-IG edge scores and faithfulness are headcount.circuits.seq2seq_* in "
        "Python; an encoder-decoder is scored at its teacher-forced targets and takes the scans attribution,"
    )


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_stacks_run_the_one_forward_cross_heads_gated_at_their_own_site(dtype):
    from headcount.model.intervention import Intervention, gated, reads
    from headcount.model.sites import Site
    from headcount.model.transformer import Memory

    model, src, tgt = model_and_inputs("t5_like", dtype)
    keep = torch.ones(3, 11, dtype=torch.bool)
    keep[1, 8:] = False
    dec = model.decoder
    with torch.no_grad():
        memory = Memory(model.encode(src, src_keep=keep), keep)
        stream = dec.embed(tgt)
        plain = dec.forward_layers(stream, 0, None, memory=memory)
        # reads at every site of every decoder layer take the hooked path with the relative bias and cross-attention:
        # the same bits as the plain path
        sites = ("resid_pre", "attn.q", "attn.z", "cross.z", "mlp.hidden", "resid_post")
        read = reads(sites, range(dec.n_layers))
        assert torch.equal(dec.forward_layers(stream, 0, read, memory=memory), plain)
        # the pattern takes the explicit path (bias and causal mask in it), SDPA's result to rounding
        patterns = reads(["attn.pattern"], range(dec.n_layers))
        explicit = dec.forward_layers(stream, 0, patterns, memory=memory)
        torch.testing.assert_close(explicit, plain, rtol=0, atol=TOL[dtype] * 10)
        assert patterns.read("attn.pattern", 0)[:, :, 0, 1:].abs().max() == 0  # causal
        assert read.read("cross.z", 1).shape == (3, 7, 3, 5)
        # the cross kind's gates are Gates at cross.z: the same as a hook zeroing that head there
        gates = torch.ones(2, 3, dtype=dtype)
        gates[1, 2] = 0
        by_gates = dec.forward_layers(stream, 0, gated(gates, site="cross.z"), memory=memory)

        def zero_head(z, site):
            return z.index_fill(2, torch.tensor([2]), 0)

        by_hook = dec.forward_layers(stream, 0, Intervention([(Site("cross.z", 1), zero_head)]), memory=memory)
        assert not torch.equal(by_gates, plain)
        torch.testing.assert_close(by_gates, by_hook, rtol=0, atol=0)
        logits = model(src, tgt, gates={"cross": gates}, src_keep=keep)
        torch.testing.assert_close(logits, dec.unembed(by_gates), rtol=0, atol=TOL[dtype])


def test_a_cross_site_on_a_stack_without_cross_attention_is_one_line():
    from headcount.model.intervention import gated, reads

    model, src, _ = model_and_inputs("t5_like", torch.float64)
    stream = model.encoder.embed(src)
    with pytest.raises(ConfigError, match=r"^hooks.site='blocks.0.cross.z': this stack has no cross-attention$"):
        model.encoder.forward_layers(stream, 0, reads(["cross.z"], [0]))
    with pytest.raises(ConfigError, match=r"^gates='cross.z': this stack has no cross-attention heads$"):
        model.encoder.forward_layers(stream, 0, gated(torch.ones(3, 4), site="cross.z"))


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["model=nmt_encdec", "trainer=smoke"],
            "data.source='induction': an encoder-decoder (model.encoder_layers=2) trains on data=translation_seq2seq "
            "(source and target sequences)",
        ),
        (
            ["data=translation_seq2seq", "trainer=smoke"],
            "data.source='translation_seq2seq': gives source and target sequences to an encoder-decoder "
            "(model.encoder_layers > 0, e.g. model=nmt_encdec); a decoder reads data=translation",
        ),
    ],
)
def test_a_model_and_data_of_different_shapes_are_one_line_before_their_lengths(compose_train, overrides, message):
    cfg = compose_train(overrides)
    with pytest.raises(ConfigError) as error:
        validate_train_config(cfg)
    assert str(error.value) == message


def test_cross_attention_keys_from_the_command_line_reach_the_model(compose_train):
    """model.cross_attn is null by default (model.attn's settings): `++model.cross_attn.<key>` changes one key of
    model.attn's settings, a mapping several, and the typed config holds an AttentionConfig either way (OmegaConf
    cannot merge into a null structured node, hence the untyped field and ModelConfig.__post_init__)."""
    from headcount.config.schema import typed

    base = ["model=nmt_encdec", "data=translation_seq2seq"]
    one = typed(compose_train([*base, "++model.cross_attn.n_kv_heads=2"]).model, ModelConfig)
    assert one.cross_attn == AttentionConfig(n_heads=4, n_kv_heads=2)  # nmt_encdec's model.attn has 4 heads
    several = typed(compose_train([*base, "model.cross_attn={n_heads:2,combine:sum}"]).model, ModelConfig)
    assert several.cross_attn == AttentionConfig(n_heads=2, combine="sum")
    assert typed(compose_train(base).model, ModelConfig).cross_attn is None
    assert build_model(several).decoder.blocks[0].cross.n_heads == 2
    assert ModelConfig(attn=AttentionConfig(n_heads=2, qkv_bias=False), cross_attn={"head_dim": 8}).cross_attn == (
        AttentionConfig(n_heads=2, qkv_bias=False, head_dim=8)
    )
