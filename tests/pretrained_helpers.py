"""Tiny random transformers models of every supported family, built from configs (no download), and where each one's
heads enter its output projection."""

import torch
import transformers as tf

from headcount.pretrained import convert

VOCAB, T = 50, 12
COMMON = {"vocab_size": VOCAB, "bos_token_id": None, "eos_token_id": None, "pad_token_id": None}
LLAMA = {"hidden_size": 32, "intermediate_size": 40, "num_hidden_layers": 2, "num_attention_heads": 4}
NEOX = {"hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4}
GPT2 = {"n_layer": 2, "n_embd": 32, "n_head": 4, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}

# Every feature a family can have: grouped-query and multi-query attention, a head width that does not split d_model,
# q/k/v biases without an output bias, rotary fractions below 1, parallel and sequential residuals, tied and untied.
CASES = {
    "gpt2_tied": lambda: tf.GPT2Config(**GPT2, n_positions=16, n_inner=48, **COMMON),
    "gpt2_untied_exact_gelu": lambda: tf.GPT2Config(
        **GPT2, n_positions=16, activation_function="gelu", tie_word_embeddings=False, **COMMON
    ),
    "llama_gqa_untied": lambda: tf.LlamaConfig(
        **LLAMA, num_key_value_heads=2, max_position_embeddings=16, rms_norm_eps=1e-5, **COMMON
    ),
    "llama_mqa_tied_biases_wide_heads": lambda: tf.LlamaConfig(
        **LLAMA,
        num_key_value_heads=1,
        head_dim=12,
        attention_bias=True,
        mlp_bias=True,
        tie_word_embeddings=True,
        max_position_embeddings=16,
        rope_parameters={"rope_type": "default", "rope_theta": 500.0},
        **COMMON,
    ),
    "qwen2_gqa": lambda: tf.Qwen2Config(**LLAMA, num_key_value_heads=2, max_position_embeddings=16, **COMMON),
    "neox_parallel": lambda: tf.GPTNeoXConfig(**NEOX, max_position_embeddings=16, rotary_pct=0.5, **COMMON),
    "neox_sequential_tied": lambda: tf.GPTNeoXConfig(
        **NEOX,
        max_position_embeddings=16,
        rotary_pct=0.25,
        use_parallel_residual=False,
        tie_word_embeddings=True,
        **COMMON,
    ),
}


def hf_model(case: str, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.nn.Module:
    """A transformers model with every weight random (norm weights and biases too, so a misplaced one shows)."""
    torch.manual_seed(seed)
    model = tf.AutoModelForCausalLM.from_config(CASES[case]())
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    return model.to(dtype).eval()


def converted(case: str, dtype: torch.dtype = torch.float32) -> tuple[torch.nn.Module, torch.nn.Module]:
    hf = hf_model(case, dtype)
    return hf, convert(hf)


def out_projection(hf: torch.nn.Module, layer: int) -> torch.nn.Module:
    """The module whose input is the concatenated heads of `layer` (o_proj, c_proj or dense)."""
    model_type = hf.config.model_type
    if model_type == "gpt2":
        return hf.transformer.h[layer].attn.c_proj
    if model_type == "gpt_neox":
        return hf.gpt_neox.layers[layer].attention.dense
    return hf.model.layers[layer].self_attn.o_proj


def tokens(batch: int = 3, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, T), generator=torch.Generator().manual_seed(seed))
