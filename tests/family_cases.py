"""Tiny random transformers models of the families beyond GPT-2, Llama 1/2, Qwen2 and GPT-NeoX, each with its
features switched on so that they bind on a 16-token sequence: sliding windows of 5 (shorter than the sequence),
rotary scalings whose factors change the angles, soft-caps small enough to change the scores and logits, q/k and
Gemma norm weights random (not ones or zeros). FEATURES names, per case, the converted model's config keys that a test
switches off to show the comparison then fails."""

import torch
import transformers as tf

VOCAB, T = 50, 16
COMMON = {"vocab_size": VOCAB, "bos_token_id": None, "eos_token_id": None, "pad_token_id": None}
SHAPE = {"hidden_size": 32, "intermediate_size": 40, "num_hidden_layers": 3, "num_attention_heads": 4}
GQA = {**SHAPE, "num_key_value_heads": 2, "max_position_embeddings": 32, **COMMON}
GEMMA = {**GQA, "head_dim": 12, "rms_norm_eps": 1e-6}
ALTERNATING = ["sliding_attention", "full_attention", "sliding_attention"]
SCALING = {"rope_theta": 100.0, "original_max_position_embeddings": 8}

CASES = {
    "gemma3": lambda: tf.Gemma3TextConfig(
        **GEMMA,
        query_pre_attn_scalar=20,
        sliding_window=5,
        layer_types=ALTERNATING,
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 50.0},
            "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1000.0},
        },
    ),
    # The image-text checkpoints (Gemma3ForConditionalGeneration): headcount converts the text decoder; its special
    # image tokens (ids 50 to 52) lie outside the test's tokens
    "gemma3_image_text": lambda: tf.Gemma3Config(
        text_config=CASES["gemma3"]().to_dict() | {"vocab_size": VOCAB + 3},
        vision_config={"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2},
        mm_tokens_per_image=4,
        boi_token_index=VOCAB,
        eoi_token_index=VOCAB + 1,
        image_token_index=VOCAB + 2,
    ),
    "gemma2": lambda: tf.Gemma2Config(
        **GEMMA,
        query_pre_attn_scalar=20,
        sliding_window=5,
        layer_types=ALTERNATING,
        attn_logit_softcapping=1.5,
        final_logit_softcapping=2.0,
        rope_parameters={"rope_type": "default", "rope_theta": 100.0},
    ),
    "gemma": lambda: tf.GemmaConfig(**{**GEMMA, "num_key_value_heads": 1}),
    "llama3": lambda: tf.LlamaConfig(
        **GQA,
        rope_parameters={"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
        | SCALING,
    ),
    "llama_linear": lambda: tf.LlamaConfig(**GQA, rope_parameters={"rope_type": "linear", "factor": 3.0}),
    "llama_dynamic": lambda: tf.LlamaConfig(
        **{**GQA, "max_position_embeddings": 8}, rope_parameters={"rope_type": "dynamic", "factor": 2.0}
    ),
    "llama_yarn": lambda: tf.LlamaConfig(**GQA, rope_parameters={"rope_type": "yarn", "factor": 4.0} | SCALING),
    "mistral": lambda: tf.MistralConfig(**GQA, head_dim=8, sliding_window=5),
    "qwen2_sliding": lambda: tf.Qwen2Config(**GQA, use_sliding_window=True, sliding_window=5, max_window_layers=1),
    "qwen3": lambda: tf.Qwen3Config(**GQA, head_dim=8, attention_bias=True),
    "olmo2": lambda: tf.Olmo2Config(**GQA),
    "phi3": lambda: tf.Phi3Config(
        **GQA,
        sliding_window=5,
        rope_parameters={"rope_type": "default", "rope_theta": 100.0, "partial_rotary_factor": 0.5},
    ),
}

# Per case: config keys of the converted model and the values that switch its features off.
FEATURES = {
    "gemma3": {
        "embed_scale": False,
        "norm": "rmsnorm",
        "post_norm": False,
        "qk_norm": "none",
        "sliding_window": None,
        "rotary_theta_local": None,
        "rope_scaling.type": "default",
        "attn.query_pre_attn_scalar": None,
        "mlp_act": "swiglu",
    },
    "gemma3_image_text": {"qk_norm": "none", "embed_scale": False},
    "gemma2": {"attn.softcap": None, "final_softcap": None, "sliding_window": None, "post_norm": False},
    "gemma": {"embed_scale": False, "norm": "rmsnorm", "mlp_act": "swiglu"},
    "llama3": {"rope_scaling.type": "default"},
    "llama_linear": {"rope_scaling.type": "default"},
    "llama_dynamic": {"rope_scaling.type": "default"},
    "llama_yarn": {"rope_scaling.type": "default", "rope_scaling.attention_factor": 1.0},
    "mistral": {"sliding_window": None},
    "qwen2_sliding": {"sliding_window": None},
    "qwen3": {"qk_norm": "none"},
    "olmo2": {"qk_norm": "none", "post_norm": False},
    "phi3": {"sliding_window": None, "rotary_fraction": 1.0},
}


def hf_model(case: str, seed: int = 0) -> torch.nn.Module:
    """A float32 transformers model, eager attention, every weight random (norm weights too, so a misplaced or
    mis-offset one shows)."""
    torch.manual_seed(seed)
    model = tf.AutoModelForCausalLM.from_config(CASES[case](), attn_implementation="eager")
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    return model.eval()


def attention_layers(hf: torch.nn.Module) -> torch.nn.ModuleList:
    """The decoder layers (an image-text model's are its language model's)."""
    inner = hf.model
    return inner.language_model.layers if hasattr(inner, "language_model") else inner.layers


def tokens(batch: int = 2, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, T), generator=torch.Generator().manual_seed(seed))
