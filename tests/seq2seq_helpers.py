"""Tiny random transformers encoder-decoders (T5 v1.0 and v1.1, BART, Marian), built from their config classes (no
download), every weight random (norms, biases, the logits bias and T5's bias tables too) and every feature binding:
more decoder than encoder layers, a head width other than d_model / heads, relative distances past the exact buckets
(T = 12 > max_exact) and past max_distance, v1.1's own unembedding, BART's position offset and embedding norm,
Marian's scaled embeddings and SiLU."""

import torch
import transformers as tf

from headcount.pretrained import convert

VOCAB, S, T = 40, 12, 9
T5 = {
    "vocab_size": VOCAB,
    "d_model": 16,
    "d_kv": 6,  # head width other than d_model / heads
    "d_ff": 24,
    "num_layers": 2,
    "num_decoder_layers": 3,
    "num_heads": 3,
    "relative_attention_num_buckets": 8,  # encoder: 4 per direction, 2 exact
    "relative_attention_max_distance": 7,
    "layer_norm_epsilon": 1e-6,
    "dropout_rate": 0.0,
    "decoder_start_token_id": 0,
    "pad_token_id": 0,
    "eos_token_id": 1,
}

BART = {
    "vocab_size": VOCAB,
    "d_model": 16,
    "encoder_layers": 2,
    "decoder_layers": 3,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "encoder_ffn_dim": 24,
    "decoder_ffn_dim": 24,
    "max_position_embeddings": 16,
    "dropout": 0.0,
    "attention_dropout": 0.0,
    "activation_dropout": 0.0,
    "scale_embedding": True,
    "pad_token_id": 0,
    "decoder_start_token_id": 2,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "forced_eos_token_id": None,
}

CASES = {
    "t5_v1_0": lambda: tf.T5Config(**T5, feed_forward_proj="relu"),
    "t5_v1_1": lambda: tf.T5Config(**T5, feed_forward_proj="gated-gelu", tie_word_embeddings=False),
    "bart": lambda: tf.BartConfig(**BART, activation_function="gelu"),
    "marian": lambda: tf.MarianConfig(**BART, activation_function="swish"),
}


def hf_model(case: str, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.nn.Module:
    """A transformers seq2seq model with every weight random, eager attention, in eval mode; T5 v1.1 with an
    unembedding of its own (transformers 5 ties it, so it is untied here)."""
    torch.manual_seed(seed)
    config = CASES[case]()
    model = tf.AutoModelForSeq2SeqLM.from_config(config, attn_implementation="eager")
    if case == "t5_v1_1":
        model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
        for name, b in model.named_buffers():
            if name.endswith("final_logits_bias"):
                b.copy_(torch.randn_like(b))
    return model.to(dtype).eval()


def converted(case: str, dtype: torch.dtype = torch.float32) -> tuple[torch.nn.Module, torch.nn.Module]:
    hf = hf_model(case, dtype)
    return hf, convert(hf)


def inputs(batch: int = 2, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Source (B, S) and decoder input (B, T) ids, no pad tokens."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (batch, S), generator=g), torch.randint(3, VOCAB, (batch, T), generator=g)


def hf_logits(hf: torch.nn.Module) -> torch.Tensor:
    src, tgt = inputs()
    return hf(input_ids=src, decoder_input_ids=tgt).logits


def our_logits(model: torch.nn.Module, **kwargs) -> torch.Tensor:
    src, tgt = inputs()
    return model(src, tgt, **kwargs)


def out_projection(hf: torch.nn.Module, kind: str, layer: int) -> torch.nn.Module:
    """The module whose input is the concatenated heads of one layer of a kind (enc, dec, cross)."""
    if hf.config.model_type == "t5":
        stack = hf.encoder if kind == "enc" else hf.decoder
        sub = 1 if kind == "cross" else 0
        attn = stack.block[layer].layer[sub]
        return (attn.EncDecAttention if kind == "cross" else attn.SelfAttention).o
    stack = hf.model.encoder if kind == "enc" else hf.model.decoder
    return getattr(stack.layers[layer], "encoder_attn" if kind == "cross" else "self_attn").out_proj


def t5_norm_in_its_dtype(self, hidden_states: torch.Tensor) -> torch.Tensor:
    """T5LayerNorm.forward with its variance in the input's dtype: transformers computes it in float32 whatever the
    dtype, which limits a float64 comparison to about 1e-7 (the float64 tests run transformers' T5 with this)."""
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))
