"""BART and Marian (transformers' BartForConditionalGeneration, MarianMTModel) as encoder-decoders: post-LN blocks
(the original Transformer's), scores scaled by 1 / sqrt(head_dim), biases everywhere, one token embedding shared by
the encoder, the decoder and the unembedding, scaled by sqrt(d_model) with scale_embedding, and a bias per token
added to the logits (final_logits_bias). BART: learned positions read at t + 2 (BartLearnedPositionalEmbedding's
offset) and a LayerNorm over each stack's embeddings (layernorm_embedding). Marian: a sinusoidal table of its own
layout (every sine, then every cosine), stored as a parameter, so it converts as learned positions; no embedding
norm; SiLU ("swish") in the MLP.

Both stacks must have the same shape (layers may differ): heads and FFN widths of the encoder and the decoder that
differ are refused by name, as is a Marian model whose decoder has a vocabulary or embedding of its own.
"""

from typing import Any

import torch
from torch import Tensor

from headcount.config.model import Activation, AttentionConfig, ModelConfig, Norm, Positions
from headcount.model.attention import fuse_qkv
from headcount.pretrained.checks import GELU_ACTIVATIONS, refuse_if, unsupported
from headcount.pretrained.weights import HFWeights, put_linear, put_norm

ACTIVATIONS = {**GELU_ACTIVATIONS, "relu": Activation.relu, "silu": Activation.silu, "swish": Activation.silu}
POSITION_OFFSET = {"bart": 2, "marian": 0}  # BartLearnedPositionalEmbedding reads row t + 2


def model_config(hf: Any, source: str) -> ModelConfig:
    model_type = hf.model_type
    act = ACTIVATIONS.get(hf.activation_function)
    if act is None:
        raise unsupported(source, model_type, f"activation_function={hf.activation_function!r}")
    for encoder_key, decoder_key in (
        ("encoder_attention_heads", "decoder_attention_heads"),
        ("encoder_ffn_dim", "decoder_ffn_dim"),
    ):
        encoder, decoder = getattr(hf, encoder_key), getattr(hf, decoder_key)
        refuse_if(encoder != decoder, source, model_type, f"with {encoder_key}={encoder} != {decoder_key}={decoder}")
    if model_type == "marian":
        shared = getattr(hf, "share_encoder_decoder_embeddings", True)
        refuse_if(not shared, source, model_type, "with share_encoder_decoder_embeddings=false")
        decoder_vocab = getattr(hf, "decoder_vocab_size", None) or hf.vocab_size
        refuse_if(decoder_vocab != hf.vocab_size, source, model_type, f"with decoder_vocab_size={decoder_vocab}")
    refuse_if(not hf.tie_word_embeddings, source, model_type, "with tie_word_embeddings=false")
    refuse_if(getattr(hf, "normalize_before", False), source, model_type, "with normalize_before (pre-LN)")
    return ModelConfig(
        n_layers=hf.decoder_layers,
        encoder_layers=hf.encoder_layers,
        d_model=hf.d_model,
        n_ctx=hf.max_position_embeddings,
        vocab_size=hf.vocab_size,
        attn=AttentionConfig(n_heads=hf.encoder_attention_heads),
        positions=Positions.learned,
        position_offset=POSITION_OFFSET[model_type],
        norm=Norm.layernorm,
        norm_eps=1e-5,  # nn.LayerNorm's default: BART and Marian set no other
        mlp=True,
        mlp_hidden=hf.encoder_ffn_dim,
        mlp_act=act,
        tie_embeddings=True,
        pre_norm=False,
        post_ln=True,
        final_norm=False,
        embed_norm=model_type == "bart",
        embed_scale=bool(hf.scale_embedding),
        logits_bias=True,
    )


def put_attention(state: dict[str, Tensor], ours: str, hf: HFWeights, theirs: str) -> None:
    qkv = [hf.take_linear(f"{theirs}.{name}_proj") for name in ("q", "k", "v")]
    put_linear(state, f"{ours}.qkv", *fuse_qkv(qkv))
    put_linear(state, f"{ours}.out", *hf.take_linear(f"{theirs}.out_proj"))


def put_stack(state: dict[str, Tensor], hf: HFWeights, stack: str, n_layers: int, cfg: ModelConfig) -> None:
    theirs_stack = f"model.{stack}"
    hf.take_optional(f"{theirs_stack}.embed_tokens.weight")  # the shared embedding again
    state[f"{stack}.pos_emb.weight"] = hf.take(f"{theirs_stack}.embed_positions.weight")
    if cfg.embed_norm:
        put_norm(state, f"{stack}.ln_emb", hf, f"{theirs_stack}.layernorm_embedding")
    for layer in range(n_layers):
        ours, theirs = f"{stack}.blocks.{layer}", f"{theirs_stack}.layers.{layer}"
        put_attention(state, f"{ours}.attn", hf, f"{theirs}.self_attn")
        put_norm(state, f"{ours}.ln_attn_add", hf, f"{theirs}.self_attn_layer_norm")
        if stack == "decoder":
            put_attention(state, f"{ours}.cross", hf, f"{theirs}.encoder_attn")
            put_norm(state, f"{ours}.ln_cross_add", hf, f"{theirs}.encoder_attn_layer_norm")
        put_linear(state, f"{ours}.mlp.fc", *hf.take_linear(f"{theirs}.fc1"))
        put_linear(state, f"{ours}.mlp.proj", *hf.take_linear(f"{theirs}.fc2"))
        put_norm(state, f"{ours}.ln_mlp_add", hf, f"{theirs}.final_layer_norm")


def state_dict(hf: HFWeights, cfg: ModelConfig) -> dict[str, Tensor]:
    shared = hf.take("model.shared.weight")
    state = {"encoder.tok_emb.weight": shared, "decoder.tok_emb.weight": shared}
    put_stack(state, hf, "encoder", cfg.encoder_layers, cfg)
    put_stack(state, hf, "decoder", cfg.n_layers, cfg)
    head = hf.take("lm_head.weight")
    if not (head is shared or torch.equal(head, shared)):
        raise unsupported(hf.model_type, hf.model_type, "with an unembedding other than the shared embedding")
    state["decoder.lm_head.weight"] = shared
    state["decoder.lm_head.bias"] = hf.take("final_logits_bias").reshape(-1)
    return state
