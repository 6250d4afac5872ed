from headcount.model.attention import AttentionConfig, MultiHeadAttention, resolve_head_dim
from headcount.model.transformer import ModelConfig, Transformer, validate_model_config

__all__ = [
    "AttentionConfig",
    "ModelConfig",
    "MultiHeadAttention",
    "Transformer",
    "resolve_head_dim",
    "validate_model_config",
]
