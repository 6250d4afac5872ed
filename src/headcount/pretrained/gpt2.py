"""GPT-2 (transformers' GPT2LMHeadModel): learned positions, LayerNorm, tanh GELU, biases everywhere.

GPT-2's projections are Conv1D layers storing weights as (in, out): they are transposed into Linear's (out, in).
c_attn's output is [q | k | v], each split into heads: headcount's fused qkv layout as it is.
"""

from typing import Any

from torch import Tensor

from headcount.config.model import AttentionConfig, ModelConfig, Norm, Positions
from headcount.pretrained.checks import gelu_activation, refuse_if
from headcount.pretrained.weights import HFWeights, put_linear, put_norm


def model_config(hf: Any, source: str) -> ModelConfig:
    refuse_if(not hf.scale_attn_weights, source, hf.model_type, "without attention scaling (scale_attn_weights)")
    refuse_if(hf.scale_attn_by_inverse_layer_idx, source, hf.model_type, "with scale_attn_by_inverse_layer_idx")
    refuse_if(getattr(hf, "add_cross_attention", False), source, hf.model_type, "with cross-attention")
    return ModelConfig(
        n_layers=hf.n_layer,
        d_model=hf.n_embd,
        n_ctx=hf.n_positions,
        vocab_size=hf.vocab_size,
        attn=AttentionConfig(n_heads=hf.n_head),
        positions=Positions.learned,
        norm=Norm.layernorm,
        norm_eps=hf.layer_norm_epsilon,
        mlp=True,
        mlp_hidden=hf.n_inner or 4 * hf.n_embd,
        mlp_act=gelu_activation(hf, "activation_function", source),
        tie_embeddings=hf.tie_word_embeddings,
    )


def state_dict(hf: HFWeights, cfg: ModelConfig) -> dict[str, Tensor]:
    state = {"tok_emb.weight": hf.take("transformer.wte.weight"), "pos_emb.weight": hf.take("transformer.wpe.weight")}
    for layer in range(cfg.n_layers):
        ours, theirs = f"blocks.{layer}", f"transformer.h.{layer}"
        put_norm(state, f"{ours}.ln_attn", hf, f"{theirs}.ln_1")
        put_linear(state, f"{ours}.attn.qkv", *hf.take_linear(f"{theirs}.attn.c_attn", transpose=True))
        put_linear(state, f"{ours}.attn.out", *hf.take_linear(f"{theirs}.attn.c_proj", transpose=True))
        put_norm(state, f"{ours}.ln_mlp", hf, f"{theirs}.ln_2")
        put_linear(state, f"{ours}.mlp.fc", *hf.take_linear(f"{theirs}.mlp.c_fc", transpose=True))
        put_linear(state, f"{ours}.mlp.proj", *hf.take_linear(f"{theirs}.mlp.c_proj", transpose=True))
    put_norm(state, "ln_f", hf, "transformer.ln_f")
    state["lm_head.weight"] = hf.take("lm_head.weight")
    return state
