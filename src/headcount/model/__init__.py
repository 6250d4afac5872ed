"""The model: a decoder-only transformer whose attention heads are defined, gated and selected in one place."""

from headcount.config.model import AttentionConfig, ModelConfig
from headcount.model.attention import MultiHeadAttention
from headcount.model.transformer import Transformer

__all__ = ["AttentionConfig", "ModelConfig", "MultiHeadAttention", "Transformer"]
