"""One transformer layer: pre-norm attention, then an optional MLP, each added to the residual stream, one after the
other or, with parallel_residual (GPT-NeoX), both read from the block's input.

`Block.forward` is heads -> gate -> finish: the attention module produces z, gates it, and `finish` takes the block
input and that z the rest of the way (combine heads, project, add, MLP). The ablation evaluator calls the same
`finish` on a cached z, so the model and the evaluator share one code path.
"""

from torch import Tensor, nn

from headcount.config.model import ModelConfig, Positions, rotary_dims
from headcount.model.attention import MultiHeadAttention
from headcount.model.mlp import MLP
from headcount.model.norm import make_norm
from headcount.model.rotary import Rotary


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, n_heads: int, head_dim: int, kv_groups: list[int] | None = None):
        super().__init__()
        a = cfg.attn
        rotary = Rotary(rotary_dims(cfg), cfg.rotary_theta) if cfg.positions == Positions.rotary else None
        self.ln_attn = make_norm(cfg)
        self.attn = MultiHeadAttention(
            cfg.d_model, n_heads, head_dim, a.combine, a.qkv_bias, a.out_bias, cfg.dropout, kv_groups, rotary
        )
        self.drop = nn.Dropout(cfg.dropout)
        self.ln_mlp = make_norm(cfg) if cfg.mlp else None
        self.mlp = MLP(cfg) if cfg.mlp else None
        self.parallel_residual = cfg.parallel_residual

    def forward(
        self,
        x_BTC: Tensor,
        gate: Tensor | None = None,
        replacement: Tensor | None = None,
        cache: dict | None = None,
        need_pattern: bool = False,
        gate_where: Tensor | None = None,
    ) -> Tensor:
        """gate, replacement, cache, need_pattern and gate_where (gate_z's where) as in MultiHeadAttention."""
        z_BTHD = self.attn.heads(self.ln_attn(x_BTC), cache, need_pattern)
        gated_BTHD = self.attn.gate_z(z_BTHD, gate, replacement, gate_where)
        if cache is not None and gate is not None:
            cache["z_gated"] = gated_BTHD  # what the heads pass on: gradients at the gates read it (attribution.py)
        return self.finish(x_BTC, gated_BTHD)

    def finish(self, x_BTC: Tensor, z_BTHD: Tensor) -> Tensor:
        """The block's output given its input x and its heads' (gated) z: add the combined heads and the MLP."""
        attn_BTC = self.drop(self.attn.combine_heads(z_BTHD))
        if self.mlp is None:
            return x_BTC + attn_BTC
        if self.parallel_residual:
            return x_BTC + attn_BTC + self.mlp(self.ln_mlp(x_BTC))
        x_BTC = x_BTC + attn_BTC
        return x_BTC + self.mlp(self.ln_mlp(x_BTC))

    def activation_floats(self, seq_len: int) -> int:
        """A generous count of the floats the block holds per position while it runs: the stream and its copies,
        the norms' outputs, and what attention and the MLP hold."""
        mlp = self.mlp.activation_floats() if self.mlp is not None else 0
        return 4 * self.attn.d_model + self.attn.activation_floats(seq_len) + mlp
