"""DistilBERT (transformers' DistilBertForMaskedLM, or the bare DistilBertModel): BERT's encoder without token types,
six post-LN layers by default, and its masked-LM head (vocab_transform, activation, vocab_layer_norm, the tied
vocab_projector with a bias). Its sinusoidal position table (sinusoidal_pos_embds) is a stored parameter and converts
as a learned table, exactly."""

from typing import Any

from torch import Tensor

from headcount.config.model import AttentionConfig, ModelConfig, Norm, Positions
from headcount.model.attention import fuse_qkv
from headcount.pretrained.bert import has_mlm_head
from headcount.pretrained.checks import gelu_activation
from headcount.pretrained.weights import HFWeights, put_linear, put_norm

EPS = 1e-12  # DistilBERT's LayerNorms' eps, fixed in its code


def model_config(hf: Any, source: str) -> ModelConfig:
    mlm = has_mlm_head(hf, source)
    return ModelConfig(
        n_layers=hf.n_layers,
        d_model=hf.dim,
        n_ctx=hf.max_position_embeddings,
        vocab_size=hf.vocab_size,
        attn=AttentionConfig(n_heads=hf.n_heads),
        positions=Positions.learned,
        norm=Norm.layernorm,
        norm_eps=EPS,
        mlp=True,
        mlp_hidden=hf.hidden_dim,
        mlp_act=gelu_activation(hf, "activation", source),
        tie_embeddings=getattr(hf, "tie_word_embeddings", True) or not mlm,
        causal=False,
        pre_norm=False,
        post_ln=True,
        embed_norm=True,
        final_norm=False,
        mlm_head=mlm,
    )


def state_dict(hf: HFWeights, cfg: ModelConfig) -> dict[str, Tensor]:
    base = "distilbert." if any(n.startswith("distilbert.") for n in hf.params) else ""
    emb = f"{base}embeddings"
    state = {
        "tok_emb.weight": hf.take(f"{emb}.word_embeddings.weight"),
        "pos_emb.weight": hf.take(f"{emb}.position_embeddings.weight"),
    }
    put_norm(state, "ln_emb", hf, f"{emb}.LayerNorm")
    for layer in range(cfg.n_layers):
        ours, theirs = f"blocks.{layer}", f"{base}transformer.layer.{layer}"
        qkv = [hf.take_linear(f"{theirs}.attention.{name}") for name in ("q_lin", "k_lin", "v_lin")]
        put_linear(state, f"{ours}.attn.qkv", *fuse_qkv(qkv))
        put_linear(state, f"{ours}.attn.out", *hf.take_linear(f"{theirs}.attention.out_lin"))
        put_norm(state, f"{ours}.ln_attn_add", hf, f"{theirs}.sa_layer_norm")
        put_linear(state, f"{ours}.mlp.fc", *hf.take_linear(f"{theirs}.ffn.lin1"))
        put_linear(state, f"{ours}.mlp.proj", *hf.take_linear(f"{theirs}.ffn.lin2"))
        put_norm(state, f"{ours}.ln_mlp_add", hf, f"{theirs}.output_layer_norm")
    if cfg.mlm_head:
        put_linear(state, "mlm.dense", *hf.take_linear("vocab_transform"))
        put_norm(state, "mlm.norm", hf, "vocab_layer_norm")
        put_linear(state, "lm_head", *hf.take_linear("vocab_projector"))
    else:
        state["lm_head.weight"] = state["tok_emb.weight"]
    return state
