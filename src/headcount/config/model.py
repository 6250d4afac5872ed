"""The model section: the transformer's shape, its attention heads and its family's parts (docs/DESIGN.md, "The math").

The defaults are the default model, `model=attn_only_2l`: Olsson et al.'s two attention-only layers of 8 heads, with
GPT-2's parts (learned positions, LayerNorm, exact GELU, biases everywhere, sequential residual). The other settings
describe the families headcount imports (headcount.pretrained) and train from scratch alike: rotary positions
(Llama, GPT-NeoX), RMSNorm and SwiGLU (Llama), grouped-query attention (Llama 2 70B, SmolLM2, Qwen2), parallel
residual (GPT-NeoX).
"""

from dataclasses import dataclass, field

from headcount.config.choice import Choice, check_choice
from headcount.errors import ConfigError


class Combine(Choice):
    concat = "concat"  # [z_1 .. z_H] W_o: one W_o slice per head
    sum = "sum"  # (sum_h z_h) W_o: one W_o shared by every head, as in the first Transformer


class Positions(Choice):
    learned = "learned"  # a learned vector per position added to the token embedding (GPT-2)
    rotary = "rotary"  # q and k rotated by the position in every layer (RoFormer; Llama, GPT-NeoX)


class Norm(Choice):
    layernorm = "layernorm"  # (x - mean) / std * weight + bias
    rmsnorm = "rmsnorm"  # x / rms(x) * weight, computed in at least float32 (Llama)


class Activation(Choice):
    gelu = "gelu"  # exact GELU
    gelu_tanh = "gelu_tanh"  # GELU's tanh approximation (GPT-2's gelu_new)
    swiglu = "swiglu"  # proj(silu(gate x) * fc x): a third, gating projection (Llama)


@dataclass
class AttentionConfig:
    n_heads: int = 8
    head_dim: int | None = None  # None: d_model // n_heads (flat cost); an int: any width, cost grows with heads
    combine: Combine = Combine.concat
    qkv_bias: bool = True
    out_bias: bool = True
    # Key/value heads, each shared by n_heads / n_kv_heads query heads (grouped-query attention); None: one per
    # query head; 1: multi-query. A head is still a query head: gates, masks and scans do not change.
    n_kv_heads: int | None = None


@dataclass
class ModelConfig:
    # A pretrained checkpoint (a save_pretrained folder, a .gguf file or a Hugging Face Hub name): it sets every shape
    # key below and the starting weights (headcount.pretrained.run_config); null: a model built from these keys.
    pretrained: str | None = None
    n_layers: int = 2
    d_model: int = 64
    n_ctx: int = 128
    vocab_size: int = 256
    attn: AttentionConfig = field(default_factory=AttentionConfig)
    positions: Positions = Positions.learned
    rotary_theta: float = 10000.0  # the rotary base: dimension pair i turns by position * theta^(-2i / rotary dims)
    rotary_fraction: float = 1.0  # the leading share of each head's dimensions that rotate (GPT-NeoX's rotary_pct)
    norm: Norm = Norm.layernorm
    norm_eps: float = 1e-5
    parallel_residual: bool = False  # x + attn(ln(x)) + mlp(ln'(x)) rather than one after the other (GPT-NeoX)
    mlp: bool = False
    mlp_ratio: int = 4
    mlp_hidden: int | None = None  # the MLP's hidden width; None: mlp_ratio * d_model
    mlp_act: Activation = Activation.gelu
    mlp_bias: bool = True
    tie_embeddings: bool = False
    dropout: float = 0.0
    # Heads per layer after structural pruning (0 allowed: a layer with every head removed); null means attn.n_heads.
    heads_per_layer: list[int] | None = None
    # After structurally pruning a grouped-query model: per layer, how many query heads share each remaining key/value
    # head, in order (a key/value head goes when all its query heads go). null means n_heads / n_kv_heads each.
    kv_groups_per_layer: list[list[int]] | None = None


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


def rotary_dims(cfg: ModelConfig) -> int:
    """How many of each head's dimensions rotate (GPT-NeoX's rule: int(head_dim * rotary_fraction))."""
    return int(resolve_head_dim(cfg.d_model, cfg.attn) * cfg.rotary_fraction)


def resolve_kv_groups(cfg: ModelConfig) -> list[list[int]]:
    """Per layer, the number of query heads sharing each key/value head, in order: [1] * H without grouping."""
    heads = list(cfg.heads_per_layer or [cfg.attn.n_heads] * cfg.n_layers)
    if cfg.kv_groups_per_layer is not None:
        groups = [list(g) for g in cfg.kv_groups_per_layer]
        if len(groups) != cfg.n_layers or any(min(g, default=1) < 1 or sum(g) != h for g, h in zip(groups, heads)):
            raise ConfigError(
                "model.kv_groups_per_layer",
                groups,
                f"needs one list per layer ({cfg.n_layers}) of positive group sizes adding up to the layer's heads "
                f"{heads}, or null",
            )
        return groups
    n_kv = cfg.attn.n_kv_heads
    if n_kv is None:
        return [[1] * h for h in heads]
    if any(h != cfg.attn.n_heads for h in heads):
        raise ConfigError(
            "model.kv_groups_per_layer",
            None,
            f"is needed when model.heads_per_layer={heads} prunes a grouped-query model (model.attn.n_kv_heads={n_kv})",
        )
    return [[cfg.attn.n_heads // n_kv] * n_kv for _ in heads]


def validate_model_config(cfg: ModelConfig) -> None:
    """Raise ConfigError for any value the model cannot be built with."""
    for key in ("n_layers", "d_model", "n_ctx", "vocab_size", "mlp_ratio"):
        if getattr(cfg, key) < 1:
            raise ConfigError(f"model.{key}", getattr(cfg, key), "must be a positive integer")
    if not 0.0 <= cfg.dropout < 1.0:
        raise ConfigError("model.dropout", cfg.dropout, "must be in [0, 1)")
    head_dim = resolve_head_dim(cfg.d_model, cfg.attn)
    n_heads, n_kv = cfg.attn.n_heads, cfg.attn.n_kv_heads
    if n_kv is not None and (n_kv < 1 or n_heads % n_kv):
        allowed = f"must divide model.attn.n_heads={n_heads} (null: one per head; 1: multi-query)"
        raise ConfigError("model.attn.n_kv_heads", n_kv, allowed)
    check_choice("model.positions", cfg.positions, Positions)
    check_choice("model.norm", cfg.norm, Norm)
    check_choice("model.mlp_act", cfg.mlp_act, Activation)
    if cfg.positions == Positions.rotary:
        if not cfg.rotary_theta > 0:
            raise ConfigError("model.rotary_theta", cfg.rotary_theta, "must be positive")
        dims = rotary_dims(cfg)
        if not 0 < cfg.rotary_fraction <= 1 or dims < 2 or dims % 2:
            raise ConfigError(
                "model.rotary_fraction",
                cfg.rotary_fraction,
                f"must be in (0, 1] and rotate an even number (2 or more) of the {head_dim} head dimensions "
                f"(int(head_dim * fraction) = {dims})",
            )
    if not cfg.norm_eps > 0:
        raise ConfigError("model.norm_eps", cfg.norm_eps, "must be positive")
    if cfg.mlp_hidden is not None and cfg.mlp_hidden < 1:
        allowed = "must be a positive integer or null (mlp_ratio * d_model)"
        raise ConfigError("model.mlp_hidden", cfg.mlp_hidden, allowed)
    if cfg.heads_per_layer is not None:
        hpl = list(cfg.heads_per_layer)
        if len(hpl) != cfg.n_layers or min(hpl) < 0:
            raise ConfigError(
                "model.heads_per_layer", hpl, f"needs {cfg.n_layers} non-negative integers (one per layer) or null"
            )
    resolve_kv_groups(cfg)
