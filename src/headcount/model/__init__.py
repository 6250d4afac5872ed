"""The model: a transformer whose attention heads are defined, gated and selected in one place (attention.py);
block.py is one layer, transformer.py one stack (a decoder or an encoder), encoder_decoder.py two stacks joined by
cross-attention (seq2seq.py: its batches, loss and greedy decoding), and rotary.py, relative.py, norm.py and mlp.py
the parts in which the families differ."""

from headcount.config.model import AttentionConfig, ModelConfig
from headcount.model.attention import MultiHeadAttention
from headcount.model.block import Block
from headcount.model.encoder_decoder import EncoderDecoder, build_model
from headcount.model.transformer import Transformer

__all__ = [
    "AttentionConfig",
    "Block",
    "EncoderDecoder",
    "ModelConfig",
    "MultiHeadAttention",
    "Transformer",
    "build_model",
]
