"""GPT-NeoX (Pythia): rotary positions on a leading fraction of each head (rotary_pct), LayerNorm, exact GELU,
parallel residual (or not: use_parallel_residual), untied unembedding.

The fused query_key_value projection is laid out per head, (H, 3, D): regrouped into headcount's (3, H, D).
"""

from typing import Any

from torch import Tensor

from headcount.config.model import AttentionConfig, ModelConfig, Norm, Positions
from headcount.model.attention import fuse_qkv
from headcount.pretrained.checks import gelu_activation, rope, rope_n_ctx
from headcount.pretrained.weights import HFWeights, put_linear, put_norm


def model_config(hf: Any, source: str) -> ModelConfig:
    theta, fraction, scaling = rope(hf, source)
    return ModelConfig(
        n_layers=hf.num_hidden_layers,
        d_model=hf.hidden_size,
        n_ctx=rope_n_ctx(hf, scaling),
        vocab_size=hf.vocab_size,
        attn=AttentionConfig(n_heads=hf.num_attention_heads, qkv_bias=hf.attention_bias, out_bias=hf.attention_bias),
        positions=Positions.rotary,
        rotary_theta=theta,
        rotary_fraction=fraction,
        rope_scaling=scaling,
        norm=Norm.layernorm,
        norm_eps=hf.layer_norm_eps,
        parallel_residual=hf.use_parallel_residual,
        mlp=True,
        mlp_hidden=hf.intermediate_size,
        mlp_act=gelu_activation(hf, "hidden_act", source),
        tie_embeddings=hf.tie_word_embeddings,
    )


def state_dict(hf: HFWeights, cfg: ModelConfig) -> dict[str, Tensor]:
    H, C = cfg.attn.n_heads, cfg.d_model
    D = C // H
    state = {"tok_emb.weight": hf.take("gpt_neox.embed_in.weight")}
    for layer in range(cfg.n_layers):
        ours, theirs = f"blocks.{layer}", f"gpt_neox.layers.{layer}"
        put_norm(state, f"{ours}.ln_attn", hf, f"{theirs}.input_layernorm")
        # GPT-NeoX interleaves its fused rows by head, [q_h | k_h | v_h] for each h: split them into q, k and v
        weight, bias = hf.take_linear(f"{theirs}.attention.query_key_value")
        weights = weight.view(H, 3, D, C).unbind(1)
        biases = (None,) * 3 if bias is None else bias.view(H, 3, D).unbind(1)
        parts = [(w.reshape(H * D, C), None if b is None else b.reshape(H * D)) for w, b in zip(weights, biases)]
        put_linear(state, f"{ours}.attn.qkv", *fuse_qkv(parts))
        put_linear(state, f"{ours}.attn.out", *hf.take_linear(f"{theirs}.attention.dense"))
        put_norm(state, f"{ours}.ln_mlp", hf, f"{theirs}.post_attention_layernorm")
        put_linear(state, f"{ours}.mlp.fc", *hf.take_linear(f"{theirs}.mlp.dense_h_to_4h"))
        put_linear(state, f"{ours}.mlp.proj", *hf.take_linear(f"{theirs}.mlp.dense_4h_to_h"))
    put_norm(state, "ln_f", hf, "gpt_neox.final_layer_norm")
    state["lm_head.weight"] = hf.take("lm_head.weight")
    return state
