"""The model section: the transformer's shape and its attention heads (docs/DESIGN.md, "The math").

The defaults are the default model, `model=attn_only_2l`: Olsson et al.'s two attention-only layers of 8 heads.
"""

from dataclasses import dataclass, field

from headcount.config.choice import Choice, check_choice
from headcount.errors import ConfigError


class Combine(Choice):
    concat = "concat"  # [z_1 .. z_H] W_o: one W_o slice per head
    sum = "sum"  # (sum_h z_h) W_o: one W_o shared by every head, as in the first Transformer


@dataclass
class AttentionConfig:
    n_heads: int = 8
    head_dim: int | None = None  # None: d_model // n_heads (flat cost); an int: any width, cost grows with heads
    combine: Combine = Combine.concat
    qkv_bias: bool = True
    out_bias: bool = True


@dataclass
class ModelConfig:
    n_layers: int = 2
    d_model: int = 64
    n_ctx: int = 128
    vocab_size: int = 256
    attn: AttentionConfig = field(default_factory=AttentionConfig)
    mlp: bool = False
    mlp_ratio: int = 4
    tie_embeddings: bool = False
    dropout: float = 0.0
    # Heads per layer after structural pruning (0 allowed: a layer with every head removed); null means attn.n_heads.
    heads_per_layer: list[int] | None = None


def resolve_head_dim(d_model: int, attn: AttentionConfig, key: str = "model.attn") -> int:
    """The per-head width, or a ConfigError naming the key that makes it impossible."""
    if attn.n_heads < 1:
        raise ConfigError(f"{key}.n_heads", attn.n_heads, "must be a positive integer")
    check_choice(f"{key}.combine", attn.combine, Combine)
    if attn.head_dim is None:
        if d_model % attn.n_heads:
            raise ConfigError(
                f"{key}.n_heads",
                attn.n_heads,
                f"must divide model.d_model={d_model} when {key}.head_dim is unset (or set {key}.head_dim)",
            )
        return d_model // attn.n_heads
    if attn.head_dim < 1:
        raise ConfigError(f"{key}.head_dim", attn.head_dim, "must be a positive integer or null")
    return attn.head_dim


def validate_model_config(cfg: ModelConfig) -> None:
    """Raise ConfigError for any value the model cannot be built with."""
    for key in ("n_layers", "d_model", "n_ctx", "vocab_size", "mlp_ratio"):
        if getattr(cfg, key) < 1:
            raise ConfigError(f"model.{key}", getattr(cfg, key), "must be a positive integer")
    if not 0.0 <= cfg.dropout < 1.0:
        raise ConfigError("model.dropout", cfg.dropout, "must be in [0, 1)")
    resolve_head_dim(cfg.d_model, cfg.attn)
    if cfg.heads_per_layer is not None:
        hpl = list(cfg.heads_per_layer)
        if len(hpl) != cfg.n_layers or min(hpl) < 0:
            raise ConfigError(
                "model.heads_per_layer", hpl, f"needs {cfg.n_layers} non-negative integers (one per layer) or null"
            )
