"""The model section: the transformer's shape and its attention heads (DESIGN.md, "The math")."""

from dataclasses import dataclass, field

from headcount.errors import ConfigError

COMBINE_MODES = ("concat", "sum")


@dataclass
class AttentionConfig:
    n_heads: int = 4
    head_dim: int | None = None  # None: d_model // n_heads (flat cost); an int: any width, cost grows with heads
    combine: str = "concat"  # concat | sum
    qkv_bias: bool = True
    out_bias: bool = True


def resolve_head_dim(d_model: int, attn: AttentionConfig, key: str = "model.attn") -> int:
    """The per-head width, or a ConfigError naming the key that makes it impossible."""
    if attn.n_heads < 1:
        raise ConfigError(f"{key}.n_heads", attn.n_heads, "must be a positive integer")
    if attn.combine not in COMBINE_MODES:
        raise ConfigError(f"{key}.combine", attn.combine, f"allowed: {', '.join(COMBINE_MODES)}")
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


@dataclass
class ModelConfig:
    n_layers: int = 2
    d_model: int = 64
    n_ctx: int = 64
    vocab_size: int = 64
    attn: AttentionConfig = field(default_factory=AttentionConfig)
    mlp: bool = True
    mlp_ratio: int = 4
    tie_embeddings: bool = False
    dropout: float = 0.0
    # Heads per layer after structural pruning (0 allowed: a layer with every head removed); null means attn.n_heads.
    heads_per_layer: list[int] | None = None


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
