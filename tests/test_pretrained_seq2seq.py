"""Encoder-decoders converted exactly: T5 v1.0 and v1.1, BART and Marian give transformers' eager logits in float32
(1e-5) and float64 (1e-10); every head's zero ablation, of every kind (encoder self-attention, decoder self-attention,
cross-attention), equals transformers with that head's slice of the output projection's input zeroed; switching any
converted feature off breaks the match. In float64, transformers' T5 runs with its norm's variance in float64 (it
computes it in float32 whatever the dtype: seq2seq_helpers.t5_norm_in_its_dtype)."""

import copy
import dataclasses

import pytest
import torch

pytest.importorskip("transformers")

import transformers as tf  # noqa: E402
from seq2seq_helpers import (  # noqa: E402
    BART,
    CASES,
    T5,
    converted,
    hf_logits,
    our_logits,
    out_projection,
    t5_norm_in_its_dtype,
)

import headcount  # noqa: E402
from headcount.config.model import AttentionConfig  # noqa: E402
from headcount.errors import ConfigError  # noqa: E402
from headcount.model.encoder_decoder import EncoderDecoder  # noqa: E402
from headcount.pretrained import hf_model_config  # noqa: E402

TOL = {torch.float32: 1e-5, torch.float64: 1e-10}


@pytest.fixture(autouse=True)
def t5_norm_variance_in_float64(monkeypatch):
    monkeypatch.setattr(tf.models.t5.modeling_t5.T5LayerNorm, "forward", t5_norm_in_its_dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("case", list(CASES))
def test_converted_encoder_decoder_gives_transformers_logits(case, dtype):
    hf, model = converted(case, dtype)
    assert isinstance(model, EncoderDecoder) and not model.training
    with torch.no_grad():
        expected = hf_logits(hf)
        got = our_logits(model)
    assert got.dtype == dtype
    torch.testing.assert_close(got, expected, rtol=0, atol=TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("case", list(CASES))
def test_every_head_of_every_kind_zero_ablated_equals_its_slice_zeroed_in_transformers(case, dtype):
    hf, model = converted(case, dtype)
    for kind, (layers, heads) in model.head_kinds.items():
        D = model.decoder.blocks[0].cross.head_dim if kind == "cross" else model.decoder.head_dim
        for layer in range(layers):
            for head in range(heads):

                def zero_head(module, args, head=head, D=D):
                    z = args[0].clone()
                    z[..., head * D : (head + 1) * D] = 0
                    return (z,)

                gates = torch.ones(layers, heads, dtype=dtype)
                gates[layer, head] = 0
                handle = out_projection(hf, kind, layer).register_forward_pre_hook(zero_head)
                try:
                    with torch.no_grad():
                        expected = hf_logits(hf)
                finally:
                    handle.remove()
                with torch.no_grad():
                    got = our_logits(model, gates={kind: gates})
                msg = f"{kind}.L{layer}H{head}"
                torch.testing.assert_close(got, expected, rtol=0, atol=TOL[dtype], msg=msg)
                assert (got - our_logits(model)).abs().max() > 1e-6, f"{msg} changes nothing"


def switched(model: EncoderDecoder, **changes) -> EncoderDecoder:
    """The converted model rebuilt with config changes, keeping every weight whose name and shape still fit; a new
    weight starts at 0 (learned positions that replace T5's bias add nothing)."""
    cfg = dataclasses.replace(copy.deepcopy(model.cfg), **changes)
    torch.manual_seed(0)
    other = EncoderDecoder(cfg).to(next(model.parameters()).dtype).eval()
    theirs = other.state_dict()
    kept = {k: v for k, v in model.state_dict().items() if k in theirs and theirs[k].shape == v.shape}
    with torch.no_grad():
        for name, p in other.named_parameters():
            if name not in kept:
                p.zero_()
    other.load_state_dict(kept, strict=False)
    return other


def encoder_bias_one_way(model: EncoderDecoder) -> EncoderDecoder:
    model.encoder.rel_bias.bidirectional = False
    return model


def decoder_bias_both_ways(model: EncoderDecoder) -> EncoderDecoder:
    model.decoder.rel_bias.bidirectional = True
    return model


def encoder_causal(model: EncoderDecoder) -> EncoderDecoder:
    for block in model.encoder.blocks:
        block.attn.features = dataclasses.replace(block.attn.features, causal=True)
    return model


def decoder_not_causal(model: EncoderDecoder) -> EncoderDecoder:
    for block in model.decoder.blocks:
        block.attn.features = dataclasses.replace(block.attn.features, causal=False)
    return model


def cross_reads_no_source(model: EncoderDecoder) -> EncoderDecoder:
    encode = model.encode
    model.encode = lambda *args, **kwargs: torch.zeros_like(encode(*args, **kwargs))  # the decoder alone
    return model


SWITCHES = [
    ("t5_v1_0", "relative_bias", {"positions": "learned", "relative_buckets": 32, "relative_max_distance": 128}),
    ("t5_v1_0", "relative_max_distance", {"relative_max_distance": 20}),
    ("t5_v1_0", "unscaled_scores", {"attn": AttentionConfig(n_heads=3, head_dim=6, qkv_bias=False, out_bias=False)}),
    ("t5_v1_0", "relu", {"mlp_act": "gelu"}),
    ("t5_v1_0", "unembed_scale", {"unembed_scale": False}),
    ("t5_v1_0", "rmsnorm", {"norm": "layernorm"}),
    ("t5_v1_0", "final_norm", {"final_norm": False}),
    ("t5_v1_0", "encoder_bias_bidirectional", encoder_bias_one_way),
    ("t5_v1_0", "decoder_bias_causal", decoder_bias_both_ways),
    ("t5_v1_0", "decoder_causal", decoder_not_causal),
    ("t5_v1_0", "encoder_bidirectional", encoder_causal),
    ("t5_v1_0", "cross_attention", cross_reads_no_source),
    ("t5_v1_1", "gated_gelu", {"mlp_act": "swiglu"}),
    ("t5_v1_1", "untied", {"tie_embeddings": True}),
    ("t5_v1_1", "unscaled_unembedding", {"unembed_scale": True}),
    ("bart", "embed_scale", {"embed_scale": False}),
    ("bart", "position_offset", {"position_offset": 0, "n_ctx": 18}),
    ("bart", "embed_norm", {"embed_norm": False}),
    ("bart", "post_ln", {"post_ln": False, "pre_norm": True}),
    ("bart", "logits_bias", {"logits_bias": False}),
    ("bart", "gelu", {"mlp_act": "relu"}),
    ("bart", "encoder_bidirectional", encoder_causal),
    ("bart", "decoder_causal", decoder_not_causal),
    ("bart", "cross_attention", cross_reads_no_source),
    ("marian", "silu", {"mlp_act": "gelu"}),
    ("marian", "embed_scale", {"embed_scale": False}),
    ("marian", "logits_bias", {"logits_bias": False}),
    ("marian", "post_ln", {"post_ln": False, "pre_norm": True}),
]


@pytest.mark.parametrize(("case", "feature", "change"), SWITCHES, ids=[f"{c}-{f}" for c, f, _ in SWITCHES])
def test_switching_a_converted_feature_off_breaks_the_match(case, feature, change):
    hf, model = converted(case, torch.float64)
    with torch.no_grad():
        expected = hf_logits(hf)
        assert (our_logits(model) - expected).abs().max() < 1e-10
        other = change(model) if callable(change) else switched(model, **change)
        got = our_logits(other)
    assert (got - expected).abs().max() > 1e-6, f"{feature} off still matched"


REFUSED = [
    (lambda: tf.BartConfig(**{**BART, "decoder_attention_heads": 2}), "with encoder_attention_heads=4 != decoder_"),
    (lambda: tf.BartConfig(**{**BART, "decoder_ffn_dim": 8}), "with encoder_ffn_dim=24 != decoder_ffn_dim=8"),
    (lambda: tf.MarianConfig(**BART, share_encoder_decoder_embeddings=False), "share_encoder_decoder_embeddings=false"),
    (lambda: tf.BartConfig(**BART, activation_function="tanh"), "activation_function='tanh'"),
    (lambda: tf.T5Config(**T5, feed_forward_proj="gated-relu"), "feed_forward_proj='gated-relu'"),
]


@pytest.mark.parametrize(("make", "message"), REFUSED, ids=[m for _, m in REFUSED])
def test_what_the_model_cannot_reproduce_is_refused_in_one_line(make, message):
    with pytest.raises(ConfigError) as error:
        hf_model_config(make(), "tiny")
    assert message in str(error.value) and str(error.value).startswith("model.pretrained='tiny': ")
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("case", ["bart", "t5_v1_1"])
def test_a_saved_folder_loads_as_the_encoder_decoder_it_converts_to(case, tmp_path):
    from seq2seq_helpers import hf_model

    from headcount.pretrained import load_pretrained

    hf = hf_model(case)
    hf.save_pretrained(tmp_path)
    model, _, _ = load_pretrained(str(tmp_path))
    assert isinstance(model, EncoderDecoder)
    assert isinstance(headcount.load_model(str(tmp_path)), headcount.HookedSeq2Seq)  # tests/test_hooks_seq2seq.py
    with torch.no_grad():
        torch.testing.assert_close(our_logits(model), hf_logits(hf), rtol=0, atol=1e-5)
