"""One transformer layer: pre-LayerNorm attention, then an optional MLP, each added to the residual stream.

`Block.forward` is heads -> gate -> finish: the attention module produces z, gates it, and `finish` takes the block
input and that z the rest of the way (combine heads, project, add, MLP). The ablation evaluator calls the same
`finish` on a cached z, so the model and the evaluator share one code path.
"""

from torch import Tensor, nn
from torch.nn import functional as F

from headcount.config.model import ModelConfig
from headcount.model.attention import MultiHeadAttention


class MLP(nn.Module):
    def __init__(self, d_model: int, hidden: int, dropout: float):
        super().__init__()
        self.fc, self.proj, self.drop = nn.Linear(d_model, hidden), nn.Linear(hidden, d_model), nn.Dropout(dropout)

    def forward(self, x_BTC: Tensor) -> Tensor:
        return self.drop(self.proj(F.gelu(self.fc(x_BTC))))

    def activation_floats(self) -> int:
        """What it holds per position: the hidden layer before and after the nonlinearity."""
        return 2 * self.fc.out_features


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, n_heads: int, head_dim: int):
        super().__init__()
        a = cfg.attn
        self.ln_attn = nn.LayerNorm(cfg.d_model)
        self.attn = MultiHeadAttention(cfg.d_model, n_heads, head_dim, a.combine, a.qkv_bias, a.out_bias, cfg.dropout)
        self.drop = nn.Dropout(cfg.dropout)
        self.ln_mlp = nn.LayerNorm(cfg.d_model) if cfg.mlp else None
        self.mlp = MLP(cfg.d_model, cfg.mlp_ratio * cfg.d_model, cfg.dropout) if cfg.mlp else None

    def forward(
        self,
        x_BTC: Tensor,
        gate: Tensor | None = None,
        replacement: Tensor | None = None,
        cache: dict | None = None,
        need_pattern: bool = False,
    ) -> Tensor:
        """gate, replacement, cache and need_pattern as in MultiHeadAttention.heads and gate_z."""
        z_BTHD = self.attn.heads(self.ln_attn(x_BTC), cache, need_pattern)
        return self.finish(x_BTC, self.attn.gate_z(z_BTHD, gate, replacement))

    def finish(self, x_BTC: Tensor, z_BTHD: Tensor) -> Tensor:
        """The block's output given its input x and its heads' (gated) z: add the combined heads, then the MLP."""
        x_BTC = x_BTC + self.drop(self.attn.combine_heads(z_BTHD))
        if self.mlp is not None:
            x_BTC = x_BTC + self.mlp(self.ln_mlp(x_BTC))
        return x_BTC

    def activation_floats(self, seq_len: int) -> int:
        """A generous count of the floats the block holds per position while it runs: the stream and its copies,
        the norms' outputs, and what attention and the MLP hold."""
        mlp = self.mlp.activation_floats() if self.mlp is not None else 0
        return 4 * self.attn.d_model + self.attn.activation_floats(seq_len) + mlp
