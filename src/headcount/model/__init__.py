"""The model: a decoder-only transformer whose attention heads are defined, gated and selected in one place
(attention.py); block.py is one layer, transformer.py the stack, and rotary.py, norm.py and mlp.py the parts in which
the families (GPT-2, Llama, GPT-NeoX) differ."""

from headcount.config.model import AttentionConfig, ModelConfig
from headcount.model.attention import MultiHeadAttention
from headcount.model.block import Block
from headcount.model.transformer import Transformer

__all__ = ["AttentionConfig", "Block", "ModelConfig", "MultiHeadAttention", "Transformer"]
