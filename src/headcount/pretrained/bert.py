"""BERT, RoBERTa and ELECTRA (transformers' *ForMaskedLM, or the bare *Model): encoders with bidirectional attention,
post-LN blocks, learned positions (RoBERTa's offset by pad_token_id + 1), token-type embeddings, a LayerNorm over the
embeddings (ELECTRA's narrower embeddings projected up to the hidden width) and BERT's masked-LM head (dense, GELU,
LayerNorm, tied decoder with a bias). A bare encoder (config.architectures names *Model, as sentence-transformers'
checkpoints do) has no head: it converts with a tied readout, logits = h E^T, and its hidden states are the model's.

RoBERTa computes positions from the input ids (pad tokens get position pad_token_id); headcount's positions are
0..T-1 plus the offset, the same for every input without pad tokens (an unpadded batch, all headcount feeds it).
"""

from typing import Any

from torch import Tensor

from headcount.config.model import Activation, AttentionConfig, ModelConfig, Norm, Positions
from headcount.model.attention import fuse_qkv
from headcount.pretrained.checks import gelu_activation, refuse_if, unsupported
from headcount.pretrained.weights import HFWeights, put_linear, put_norm

BASE = {"bert": "bert", "roberta": "roberta", "electra": "electra"}  # the encoder's prefix inside *ForMaskedLM


def has_mlm_head(hf: Any, source: str) -> bool:
    """True for *ForMaskedLM (and a config without architectures, as one built in code); False for the bare *Model."""
    archs = getattr(hf, "architectures", None) or []
    if not archs or any(a.endswith("ForMaskedLM") for a in archs):
        return True
    if any(a.endswith("Model") and "For" not in a for a in archs):
        return False
    raise unsupported(source, hf.model_type, f"architecture {archs[0]} (supported: *ForMaskedLM or the bare *Model)")


def model_config(hf: Any, source: str) -> ModelConfig:
    model_type = hf.model_type
    refuse_if(getattr(hf, "is_decoder", False), source, model_type, "as a decoder (is_decoder)")
    refuse_if(getattr(hf, "add_cross_attention", False), source, model_type, "with cross-attention")
    position_type = getattr(hf, "position_embedding_type", "absolute")
    refuse_if(position_type != "absolute", source, model_type, f"with position_embedding_type={position_type!r}")
    act = gelu_activation(hf, "hidden_act", source)
    mlm = has_mlm_head(hf, source)
    # RoBERTa's and ELECTRA's MLM transforms use exact GELU whatever hidden_act says; BERT's uses hidden_act
    refuse_if(mlm and model_type != "bert" and act != Activation.gelu, source, model_type, "with hidden_act != gelu")
    d_embed = getattr(hf, "embedding_size", hf.hidden_size)
    offset = hf.pad_token_id + 1 if model_type == "roberta" else 0
    return ModelConfig(
        n_layers=hf.num_hidden_layers,
        d_model=hf.hidden_size,
        n_ctx=hf.max_position_embeddings - offset,
        vocab_size=hf.vocab_size,
        attn=AttentionConfig(n_heads=hf.num_attention_heads),
        positions=Positions.learned,
        position_offset=offset,
        norm=Norm.layernorm,
        norm_eps=hf.layer_norm_eps,
        mlp=True,
        mlp_hidden=hf.intermediate_size,
        mlp_act=act,
        tie_embeddings=getattr(hf, "tie_word_embeddings", True) or not mlm,
        causal=False,
        pre_norm=False,
        post_ln=True,
        type_vocab_size=hf.type_vocab_size,
        embed_norm=True,
        d_embed=None if d_embed == hf.hidden_size else d_embed,
        final_norm=False,
        mlm_head=mlm,
    )


def state_dict(hf: HFWeights, cfg: ModelConfig) -> dict[str, Tensor]:
    model_type = hf.model_type
    base = f"{BASE[model_type]}." if any(n.startswith(f"{BASE[model_type]}.") for n in hf.params) else ""
    emb = f"{base}embeddings"
    state = {
        "tok_emb.weight": hf.take(f"{emb}.word_embeddings.weight"),
        "pos_emb.weight": hf.take(f"{emb}.position_embeddings.weight"),
        "type_emb.weight": hf.take(f"{emb}.token_type_embeddings.weight"),
    }
    put_norm(state, "ln_emb", hf, f"{emb}.LayerNorm")
    if cfg.d_embed is not None:
        put_linear(state, "emb_proj", *hf.take_linear(f"{base}embeddings_project"))
    for layer in range(cfg.n_layers):
        ours, theirs = f"blocks.{layer}", f"{base}encoder.layer.{layer}"
        att = f"{theirs}.attention"
        qkv = [hf.take_linear(f"{att}.self.{name}") for name in ("query", "key", "value")]
        put_linear(state, f"{ours}.attn.qkv", *fuse_qkv(qkv))
        put_linear(state, f"{ours}.attn.out", *hf.take_linear(f"{att}.output.dense"))
        put_norm(state, f"{ours}.ln_attn_add", hf, f"{att}.output.LayerNorm")
        put_linear(state, f"{ours}.mlp.fc", *hf.take_linear(f"{theirs}.intermediate.dense"))
        put_linear(state, f"{ours}.mlp.proj", *hf.take_linear(f"{theirs}.output.dense"))
        put_norm(state, f"{ours}.ln_mlp_add", hf, f"{theirs}.output.LayerNorm")
    for name in ("pooler.dense.weight", "pooler.dense.bias"):  # a bare model's pooler: not part of the hidden states
        hf.take_optional(f"{base}{name}")
    if cfg.mlm_head:
        put_mlm_head(state, hf, model_type)
    else:
        state["lm_head.weight"] = state["tok_emb.weight"]
    return state


def put_mlm_head(state: dict[str, Tensor], hf: HFWeights, model_type: str) -> None:
    head = {
        "bert": ("cls.predictions.transform.dense", "cls.predictions.transform.LayerNorm", "cls.predictions.decoder"),
        "roberta": ("lm_head.dense", "lm_head.layer_norm", "lm_head.decoder"),
        "electra": ("generator_predictions.dense", "generator_predictions.LayerNorm", "generator_lm_head"),
    }[model_type]
    dense, norm, decoder = head
    put_linear(state, "mlm.dense", *hf.take_linear(dense))
    put_norm(state, "mlm.norm", hf, norm)
    put_linear(state, "lm_head", *hf.take_linear(decoder))
    # the decoder's bias is also registered as the head's own `bias` (the same tensor)
    hf.take_optional({"bert": "cls.predictions.bias", "roberta": "lm_head.bias"}.get(model_type, ""))
