"""The model section: the transformer's shape, its attention heads and its family's parts (docs/DESIGN.md, "The math").

The defaults are the default model, `model=attn_only_2l`: Olsson et al.'s two attention-only layers of 8 heads, with
GPT-2's parts (learned positions, LayerNorm, exact GELU, biases everywhere, sequential residual). The other settings
describe the families headcount imports (headcount.pretrained) and train from scratch alike: rotary positions
(Llama, GPT-NeoX) and their scalings (Llama 3, Qwen2.5 long-context, Gemma 3's global layers), RMSNorm and SwiGLU
(Llama), grouped-query attention (Llama 2 70B, SmolLM2, Qwen2), parallel residual (GPT-NeoX), sliding-window attention
on every layer or a pattern of layers (Mistral, Qwen2, Gemma 2/3), q/k norms (Qwen3, Gemma 3, OLMo 2), sandwich and
post norms (Gemma 2/3, OLMo 2), Gemma's (1 + w) RMSNorm, embedding scaling and GeGLU, and soft-capped logits (Gemma 2).
Every key's default is the behaviour before it existed, so older checkpoints rebuild the same model.
"""

from dataclasses import dataclass, field
from typing import Any

from headcount.config.choice import Choice, check_bools, check_choice
from headcount.errors import ConfigError, check_positive, finite, unknown_key


class Combine(Choice):
    concat = "concat"  # [z_1 .. z_H] W_o: one W_o slice per head
    sum = "sum"  # (sum_h z_h) W_o: one W_o shared by every head, as in the first Transformer


class Positions(Choice):
    learned = "learned"  # a learned vector per position added to the token embedding (GPT-2)
    rotary = "rotary"  # q and k rotated by the position in every layer (RoFormer; Llama, GPT-NeoX)
    # Each layer's own learned vector per position added to the normalised input of its queries and keys, never to
    # the values or the residual stream (Press et al. 2021's position-infused attention; TransformerLens's
    # "shortformer", the positions of its attention-only toy models): heads can attend by position, but no head can
    # move a position into the stream
    shortformer = "shortformer"
    # The original Transformer's fixed table added to the token embedding: PE(t, 2i) = sin(t / 10000^(2i / C)),
    # PE(t, 2i + 1) = cos(t / 10000^(2i / C)) (Vaswani et al. 2017), computed in float64; nothing to learn
    sinusoidal = "sinusoidal"
    # No absolute positions: T5's relative position bias, b_h(bucket(s - t)) added to head h's scores, one learned
    # table per stack shared by its layers (relative_buckets, relative_max_distance)
    relative = "relative"


class Norm(Choice):
    layernorm = "layernorm"  # (x - mean) / std * weight + bias
    rmsnorm = "rmsnorm"  # x / rms(x) * weight, computed in at least float32 (Llama)
    # x / rms(x) * (1 + weight), the weight applied in at least float32 before the cast back (Gemma 1/2/3)
    rmsnorm_plus_one = "rmsnorm_plus_one"


class Activation(Choice):
    gelu = "gelu"  # exact GELU
    gelu_tanh = "gelu_tanh"  # GELU's tanh approximation (GPT-2's gelu_new)
    swiglu = "swiglu"  # proj(silu(gate x) * fc x): a third, gating projection (Llama)
    geglu_tanh = "geglu_tanh"  # proj(gelu_tanh(gate x) * fc x): GeGLU with GELU's tanh approximation (Gemma)
    relu = "relu"  # the original Transformer's and T5 v1.0's
    silu = "silu"  # x sigmoid(x), ungated (Marian's "swish")


class QKNorm(Choice):
    none = "none"
    # An RMSNorm (model.norm's form) over each head's D dimensions of q and of k, one weight each shared by the heads,
    # before rotary positions (Qwen3, Gemma 3)
    head = "head"
    # An RMSNorm over the whole q projection (H * D) and the whole k projection (H_kv * D), before the split into
    # heads (OLMo 2): every head's q depends on every other head's
    projection = "projection"


class RopeType(Choice):
    # transformers' modeling_rope_utils names; each changes the rotary frequencies (and yarn the cos/sin scale)
    default = "default"  # theta^(-2i / dims)
    linear = "linear"  # the default frequencies / factor (position interpolation)
    dynamic = "dynamic"  # NTK: a larger base when a sequence is longer than rope_scaling.original_n_ctx
    yarn = "yarn"  # YaRN: interpolated low and extrapolated high frequencies, cos and sin scaled by attention_factor
    llama3 = "llama3"  # Llama 3.1: low frequencies / factor, high ones kept, a smooth ramp between


class LayerType(Choice):
    full = "full"  # causal attention over every earlier position
    sliding = "sliding"  # causal attention over the last model.sliding_window positions (itself included)


@dataclass
class RopeScalingConfig:
    type: RopeType = RopeType.default
    factor: float = 1.0  # linear, dynamic, yarn, llama3: how much longer the context it was scaled for
    # The context it was pretrained for: llama3's and yarn's wavelength bounds, dynamic's threshold; null: model.n_ctx
    original_n_ctx: int | None = None
    low_freq_factor: float = 1.0  # llama3: wavelengths above original_n_ctx / low_freq_factor are divided by factor
    high_freq_factor: float = 4.0  # llama3: wavelengths below original_n_ctx / high_freq_factor are kept
    beta_fast: float = 32.0  # yarn: the ramp's bounds, in rotations over original_n_ctx
    beta_slow: float = 1.0
    attention_factor: float | None = None  # yarn: the cos/sin scale; null: 0.1 ln(factor) + 1
    truncate: bool = True  # yarn: round the ramp's bounds to whole dimensions


# The rope types that read each scaling key: set to anything but its default under another type, a key is refused
# rather than ignored.
ROPE_KEYS_USED_BY = {
    "factor": (RopeType.linear, RopeType.dynamic, RopeType.yarn, RopeType.llama3),
    "original_n_ctx": (RopeType.dynamic, RopeType.yarn, RopeType.llama3),
    "low_freq_factor": (RopeType.llama3,),
    "high_freq_factor": (RopeType.llama3,),
    "beta_fast": (RopeType.yarn,),
    "beta_slow": (RopeType.yarn,),
    "attention_factor": (RopeType.yarn,),
    "truncate": (RopeType.yarn,),
}


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
    # Scores are (q . k) * query_pre_attn_scalar^(-1/2) (Gemma's query_pre_attn_scalar); null: head_dim, the usual
    # 1 / sqrt(head_dim)
    query_pre_attn_scalar: float | None = None
    # Soft-capped scores, cap * tanh(scores / cap), before the causal mask (Gemma 2); null: none. A capped model runs
    # the explicit attention path (SDPA cannot cap).
    softcap: float | None = None


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
    # Rotary scaling (transformers' rope_type) on every layer, or only on full-attention layers when
    # rotary_theta_local is set
    rope_scaling: RopeScalingConfig = field(default_factory=RopeScalingConfig)
    # The sliding-window layers' own rotary base, unscaled (Gemma 3's rope_local_base_freq); null: as the full layers
    rotary_theta_local: float | None = None
    # Sliding-window attention: a position attends to itself and the sliding_window - 1 positions before it, on the
    # layers layer_types marks "sliding"; null: every layer attends to every earlier position
    sliding_window: int | None = None
    # Per layer, "full" or "sliding"; null: every layer "sliding" when sliding_window is set (Mistral), else "full"
    layer_types: list[str] | None = None
    qk_norm: QKNorm = QKNorm.none
    norm: Norm = Norm.layernorm
    norm_eps: float = 1e-5
    parallel_residual: bool = False  # x + attn(ln(x)) + mlp(ln'(x)) rather than one after the other (GPT-NeoX)
    pre_norm: bool = True  # normalise attention's and the MLP's inputs (ln_attn, ln_mlp); false: OLMo 2
    # Normalise attention's output (after the heads combine, so gating z means the same) and the MLP's output before
    # each is added to the stream (ln_attn_out, ln_mlp_out): Gemma 2/3's sandwich with pre_norm, OLMo 2's without
    post_norm: bool = False
    embed_scale: bool = False  # token embeddings times sqrt(d_model), the factor rounded to the model's dtype (Gemma)
    final_softcap: float | None = None  # logits capped to cap * tanh(logits / cap) (Gemma 2); null: none
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
    # Encoders (docs/guide/encoders.md). false: bidirectional self-attention, every position attends to every position
    # (BERT); true: the decoder's causal attention
    causal: bool = True
    # Post-LN blocks, x <- norm(x + attn(x)), x <- norm(x + mlp(x)) (the original Transformer, BERT; ln_attn_add,
    # ln_mlp_add); needs pre_norm, post_norm and parallel_residual false
    post_ln: bool = False
    type_vocab_size: int = 0  # token-type (segment) embeddings added to the token embedding (BERT: 2); 0: none
    embed_norm: bool = False  # a norm over the summed embeddings, before anything else sees them (BERT's ln_emb)
    # The embeddings' width when it differs from d_model, projected up to d_model after embed_norm (ELECTRA's
    # embedding_size, emb_proj); null: d_model
    d_embed: int | None = None
    position_offset: int = 0  # learned positions: position t reads row t + offset (RoBERTa: pad_token_id + 1)
    final_norm: bool = True  # ln_f before the unembedding; false: none (post-LN models end normalised)
    # BERT's masked-LM head: the unembedding reads norm(act(dense(x))) (act: mlp_act; width d_embed) and adds a bias
    mlm_head: bool = False
    # Encoder-decoders (docs/guide/encoders.md, "Encoder-decoders"). The number of encoder layers: 0, a decoder-only
    # model; above 0, a bidirectional encoder of that many layers and a decoder of n_layers layers whose blocks also
    # attend to the encoder's output (cross-attention), sharing one token embedding; both stacks take every other key
    encoder_layers: int = 0
    # The cross-attention heads, configured like model.attn (number, width, concat or sum, key/value groups, biases,
    # score scale); null: the same as model.attn; a mapping: model.attn's settings with the keys it gives. Only with
    # encoder_layers > 0. Typed Any for Hydra, which cannot set a key inside a null structured node from the command
    # line (`++model.cross_attn.n_heads=2` would fail in OmegaConf): __post_init__ types it
    cross_attn: Any = None
    # After structurally pruning an encoder-decoder (EncoderDecoder.select_heads): the encoder's self-attention heads
    # per layer and the decoder's cross-attention heads per layer (the decoder's self-attention's are heads_per_layer),
    # and their key/value groups as kv_groups_per_layer's; null: model.attn.n_heads (model.cross_attn's) in every layer
    encoder_heads_per_layer: list[int] | None = None
    encoder_kv_groups_per_layer: list[list[int]] | None = None
    cross_heads_per_layer: list[int] | None = None
    cross_kv_groups_per_layer: list[list[int]] | None = None
    # positions=relative (T5): the number of buckets of relative distance (half per direction in the encoder) and the
    # distance from which every bucket is the last
    relative_buckets: int = 32
    relative_max_distance: int = 128
    unembed_scale: bool = False  # the unembedding's input times d_model^(-1/2) (T5 v1.0 with tied embeddings)
    logits_bias: bool = False  # a bias per token added to the logits (BART's and Marian's final_logits_bias)

    def __post_init__(self) -> None:
        if self.cross_attn is not None and not isinstance(self.cross_attn, AttentionConfig):
            self.cross_attn = typed_attention(self.cross_attn, "model.cross_attn", self.attn)


def typed_attention(keys: Any, key: str, base: AttentionConfig) -> AttentionConfig:
    """An attention section given as a mapping (a config's `model.cross_attn`), as an AttentionConfig whose keys the
    mapping leaves out are base's (model.attn's); a ConfigError naming the key for a key it lacks or a value of the
    wrong type."""
    from omegaconf import DictConfig, OmegaConf
    from omegaconf.errors import ConfigKeyError, ValidationError

    if not isinstance(keys, dict | DictConfig):
        raise ConfigError(key, keys, "must be a mapping of model.attn's keys (n_heads, head_dim, ...) or null")
    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(base), keys))
    except ConfigKeyError as e:
        raise unknown_key(f"{key}.{e.key}", keys.get(e.key), AttentionConfig.__dataclass_fields__) from None
    except ValidationError as e:
        reason = e.msg.splitlines()[0]
        if "expected one of [" in reason:
            reason = "allowed: " + reason.split("expected one of [", 1)[1].rstrip("]")
        raise ConfigError(f"{key}.{e.key}", keys.get(e.key), reason) from None


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


def resolve_layer_types(cfg: ModelConfig) -> list[str]:
    """Per layer, "full" or "sliding" (model.layer_types, or its default)."""
    if cfg.layer_types is not None:
        return [str(t) for t in cfg.layer_types]
    return [LayerType.sliding if cfg.sliding_window is not None else LayerType.full] * cfg.n_layers


def resolve_kv_groups(cfg: ModelConfig) -> list[list[int]]:
    """Per layer, the number of query heads sharing each key/value head, in order: [1] * H without grouping."""
    return resolve_groups(cfg.n_layers, cfg.attn, cfg.heads_per_layer, cfg.kv_groups_per_layer, "model.")


def resolve_cross_groups(cfg: ModelConfig) -> list[list[int]] | None:
    """An encoder-decoder's cross-attention heads per decoder layer as key/value groups (resolve_kv_groups' form, from
    model.cross_heads_per_layer and cross_kv_groups_per_layer); None without an encoder."""
    cross = cross_attention(cfg)
    if cross is None:
        return None
    attn_key = "model.attn" if cfg.cross_attn is None else "model.cross_attn"
    groups = cfg.cross_kv_groups_per_layer
    return resolve_groups(cfg.n_layers, cross, cfg.cross_heads_per_layer, groups, "model.cross_", attn_key)


def resolve_groups(
    n_layers: int,
    attn: AttentionConfig,
    heads_per_layer: list[int] | None,
    groups_per_layer: list[list[int]] | None,
    prefix: str,
    attn_key: str = "model.attn",
) -> list[list[int]]:
    """Per layer, the query heads sharing each key/value head of one kind of attention; prefix names its keys
    (model.heads_per_layer, model.kv_groups_per_layer; model.cross_heads_per_layer, ...)."""
    heads_key, groups_key = f"{prefix}heads_per_layer", f"{prefix}kv_groups_per_layer"
    if heads_per_layer is not None:
        hpl = list(heads_per_layer)
        if len(hpl) != n_layers or min(hpl) < 0:
            raise ConfigError(heads_key, hpl, f"needs {n_layers} non-negative integers (one per layer) or null")
    heads = list(heads_per_layer or [attn.n_heads] * n_layers)
    if groups_per_layer is not None:
        groups = [list(g) for g in groups_per_layer]
        if len(groups) != n_layers or any(min(g, default=1) < 1 or sum(g) != h for g, h in zip(groups, heads)):
            raise ConfigError(
                groups_key,
                groups,
                f"needs one list per layer ({n_layers}) of positive group sizes adding up to the layer's heads "
                f"{heads}, or null",
            )
        return groups
    n_kv = attn.n_kv_heads
    if n_kv is None:
        return [[1] * h for h in heads]
    if any(h != attn.n_heads for h in heads):
        raise ConfigError(
            groups_key,
            None,
            f"is needed when {heads_key}={heads} prunes a grouped-query model ({attn_key}.n_kv_heads={n_kv})",
        )
    return [[attn.n_heads // n_kv] * n_kv for _ in heads]


def validate_model_config(cfg: ModelConfig) -> None:
    """Raise ConfigError for any value the model cannot be built with, and for a key set that the model would not
    use (it would look as if it had)."""
    check_bools("model", cfg)
    check_bools("model.attn", cfg.attn)
    check_bools("model.rope_scaling", cfg.rope_scaling)
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
        check_positive("model.rotary_theta", cfg.rotary_theta)
        dims = rotary_dims(cfg)
        if not 0 < cfg.rotary_fraction <= 1 or dims < 2 or dims % 2:
            raise ConfigError(
                "model.rotary_fraction",
                cfg.rotary_fraction,
                f"must be in (0, 1] and rotate an even number (2 or more) of the {head_dim} head dimensions "
                f"(int(head_dim * fraction) = {dims})",
            )
    else:
        refuse_unused(cfg, ModelConfig(), ("rotary_theta", "rotary_fraction"), f"model.positions={cfg.positions}")
    validate_rotary_scaling(cfg)
    validate_attention_features(cfg)
    check_positive("model.norm_eps", cfg.norm_eps)
    if cfg.mlp_hidden is not None and cfg.mlp_hidden < 1:
        allowed = "must be a positive integer or null (mlp_ratio * d_model)"
        raise ConfigError("model.mlp_hidden", cfg.mlp_hidden, allowed)
    if not cfg.mlp:
        refuse_unused(cfg, ModelConfig(), ("mlp_ratio", "mlp_hidden", "mlp_act", "mlp_bias"), "model.mlp=false")
    resolve_kv_groups(cfg)
    validate_encoder_features(cfg)
    validate_encoder_decoder(cfg)


def embed_width(cfg: ModelConfig) -> int:
    """The token embedding's width: model.d_embed, or d_model."""
    return cfg.d_embed or cfg.d_model


def validate_encoder_features(cfg: ModelConfig) -> None:
    """Bidirectional attention, post-LN blocks, token types, the embedding norm and width, the masked-LM head."""
    if cfg.post_ln and (cfg.pre_norm or cfg.post_norm or cfg.parallel_residual):
        allowed = "needs model.pre_norm=false, model.post_norm=false and model.parallel_residual=false"
        raise ConfigError("model.post_ln", cfg.post_ln, allowed)
    if not cfg.causal and cfg.sliding_window is not None:
        raise ConfigError("model.sliding_window", cfg.sliding_window, "must be null when model.causal=false")
    if cfg.type_vocab_size < 0:
        raise ConfigError("model.type_vocab_size", cfg.type_vocab_size, "must be 0 (none) or a positive integer")
    if cfg.d_embed is not None and cfg.d_embed < 1:
        raise ConfigError("model.d_embed", cfg.d_embed, "must be a positive integer or null (d_model)")
    if cfg.position_offset and (cfg.position_offset < 0 or cfg.positions != Positions.learned):
        raise ConfigError("model.position_offset", cfg.position_offset, "must be 0, or positive with positions=learned")
    if cfg.tie_embeddings and not cfg.mlm_head and embed_width(cfg) != cfg.d_model:
        allowed = f"needs model.mlm_head=true (the unembedding reads d_model={cfg.d_model}) or d_embed=null"
        raise ConfigError("model.d_embed", cfg.d_embed, allowed)


def validate_encoder_decoder(cfg: ModelConfig) -> None:
    """The encoder-decoder's keys: encoder_layers, cross_attn, the relative position bias."""
    if cfg.encoder_layers < 0:
        raise ConfigError("model.encoder_layers", cfg.encoder_layers, "must be 0 (decoder-only) or a positive integer")
    if cfg.positions == Positions.relative:
        if cfg.relative_buckets < 2 or (bidirectional_bias(cfg) and cfg.relative_buckets < 4):
            allowed = "must be at least 2 (4 for bidirectional attention, whose buckets split by direction)"
            raise ConfigError("model.relative_buckets", cfg.relative_buckets, allowed)
        exact = cfg.relative_buckets // 2 if bidirectional_bias(cfg) else cfg.relative_buckets
        if cfg.relative_max_distance <= exact // 2:
            allowed = f"must exceed the exactly bucketed distances ({exact // 2} with {cfg.relative_buckets} buckets)"
            raise ConfigError("model.relative_max_distance", cfg.relative_max_distance, allowed)
    else:
        relative_keys = ("relative_buckets", "relative_max_distance")
        refuse_unused(cfg, ModelConfig(), relative_keys, f"model.positions={cfg.positions}")
    for key in ("heads_per_layer", "encoder_heads_per_layer"):
        if cfg.positions == Positions.relative and getattr(cfg, key) is not None:
            allowed = "must be null with model.positions=relative (the bias table has a row per head of model.attn)"
            raise ConfigError(f"model.{key}", list(getattr(cfg, key)), allowed)
    if not cfg.encoder_layers:
        if cfg.cross_attn is not None:
            allowed = "is the cross-attention of an encoder-decoder; set model.encoder_layers > 0 or leave it unset"
            raise ConfigError("model.cross_attn", "set", allowed)
        refuse_unused(cfg, ModelConfig(), ENCODER_DECODER_HEADS, "model.encoder_layers=0")
        return
    if not cfg.causal:
        allowed = "must be true in an encoder-decoder (its decoder is causal; its encoder is always bidirectional)"
        raise ConfigError("model.causal", cfg.causal, allowed)
    for key in ("type_vocab_size", "mlm_head", "parallel_residual"):
        refuse_unused(cfg, ModelConfig(), (key,), f"model.encoder_layers={cfg.encoder_layers}")
    encoder_groups = cfg.encoder_kv_groups_per_layer
    resolve_groups(cfg.encoder_layers, cfg.attn, cfg.encoder_heads_per_layer, encoder_groups, "model.encoder_")
    refuse_unused(cfg, ModelConfig(), ("sliding_window", "layer_types"), "model.encoder_layers > 0")
    if cfg.cross_attn is not None:
        check_bools("model.cross_attn", cfg.cross_attn)
        cross = cfg.cross_attn
        resolve_head_dim(cfg.d_model, cross, "model.cross_attn")
        if cross.n_kv_heads is not None and (cross.n_kv_heads < 1 or cross.n_heads % cross.n_kv_heads):
            allowed = f"must divide model.cross_attn.n_heads={cross.n_heads} (null: one per head; 1: multi-query)"
            raise ConfigError("model.cross_attn.n_kv_heads", cross.n_kv_heads, allowed)
        for key, value in (("query_pre_attn_scalar", cross.query_pre_attn_scalar), ("softcap", cross.softcap)):
            if value is not None:
                check_positive(f"model.cross_attn.{key}", value, "must be a finite number above 0 or null")
    resolve_cross_groups(cfg)


# The head counts a structurally pruned encoder-decoder records (EncoderDecoder.select_heads)
ENCODER_DECODER_HEADS = (
    "encoder_heads_per_layer",
    "encoder_kv_groups_per_layer",
    "cross_heads_per_layer",
    "cross_kv_groups_per_layer",
)


def bidirectional_bias(cfg: ModelConfig) -> bool:
    """Whether some stack of the model reads its relative position bias in both directions (an encoder)."""
    return bool(cfg.encoder_layers) or not cfg.causal


def cross_attention(cfg: ModelConfig) -> AttentionConfig | None:
    """The decoder's cross-attention heads: model.cross_attn, or model.attn's settings; None without an encoder."""
    if not cfg.encoder_layers:
        return None
    return cfg.cross_attn if cfg.cross_attn is not None else cfg.attn


def refuse_unused(section: object, defaults: object, keys: tuple[str, ...], why: str, prefix: str = "model") -> None:
    """ConfigError for the first of keys set to other than its default where `why` (a setting) leaves it unread."""
    for key in keys:
        value = getattr(section, key)
        if value != getattr(defaults, key):
            shown = f"{prefix}.{key}"
            raise ConfigError(shown, value, f"is not used with {why}; leave {shown} unset or change that setting")


def validate_rotary_scaling(cfg: ModelConfig) -> None:
    rs = cfg.rope_scaling
    check_choice("model.rope_scaling.type", rs.type, RopeType)
    unused = tuple(key for key, types in ROPE_KEYS_USED_BY.items() if rs.type not in types)
    refuse_unused(rs, RopeScalingConfig(), unused, f"model.rope_scaling.type={rs.type}", "model.rope_scaling")
    if rs.type == RopeType.default:
        return
    if cfg.positions != Positions.rotary:
        raise ConfigError("model.rope_scaling.type", rs.type, "needs model.positions=rotary (or type=default)")
    if not (finite(rs.factor) and rs.factor > 0) or (rs.type in (RopeType.linear, RopeType.dynamic) and rs.factor < 1):
        allowed = "must be a finite number above 0 (1 or more for linear and dynamic)"
        raise ConfigError("model.rope_scaling.factor", rs.factor, allowed)
    if rs.original_n_ctx is not None and rs.original_n_ctx < 1:
        raise ConfigError("model.rope_scaling.original_n_ctx", rs.original_n_ctx, "must be a positive integer or null")
    if rs.type == RopeType.llama3:
        check_positive("model.rope_scaling.high_freq_factor", rs.high_freq_factor)
        if not 0 < rs.low_freq_factor < rs.high_freq_factor:
            allowed = f"must be positive and below model.rope_scaling.high_freq_factor={rs.high_freq_factor}"
            raise ConfigError("model.rope_scaling.low_freq_factor", rs.low_freq_factor, allowed)
    if rs.type == RopeType.yarn:
        validate_yarn(cfg)


def validate_yarn(cfg: ModelConfig) -> None:
    """YaRN's ramp runs between the dimensions that turn beta_fast and beta_slow times over original_n_ctx, found
    through ln(rotations) / ln(rotary_theta): transformers takes beta_fast >= beta_slow (32 and 1 by default)."""
    rs = cfg.rope_scaling
    ramp = "yarn's ramp bounds, in rotations over original_n_ctx"
    check_positive("model.rope_scaling.beta_slow", rs.beta_slow, f"must be a finite number above 0 ({ramp})")
    if not (finite(rs.beta_fast) and rs.beta_fast >= rs.beta_slow):
        allowed = f"must be a finite number of at least model.rope_scaling.beta_slow={rs.beta_slow} ({ramp})"
        raise ConfigError("model.rope_scaling.beta_fast", rs.beta_fast, allowed)
    if not cfg.rotary_theta > 1:  # finite: validate_model_config checked it
        allowed = "must be above 1 with model.rope_scaling.type=yarn (its ramp divides by ln(rotary_theta))"
        raise ConfigError("model.rotary_theta", cfg.rotary_theta, allowed)
    if rs.attention_factor is not None:
        check_positive(
            "model.rope_scaling.attention_factor", rs.attention_factor, "must be a finite number above 0 or null"
        )


def validate_attention_features(cfg: ModelConfig) -> None:
    """Sliding windows and their layer pattern, q/k norms, the score scale and the soft-caps."""
    if cfg.sliding_window is not None and cfg.sliding_window < 1:
        raise ConfigError("model.sliding_window", cfg.sliding_window, "must be a positive integer or null")
    if cfg.layer_types is not None:
        types = list(cfg.layer_types)
        allowed = f"needs {cfg.n_layers} entries (one per layer), each one of: {', '.join(LayerType)}"
        if len(types) != cfg.n_layers or any(t not in LayerType.__members__ for t in types):
            raise ConfigError("model.layer_types", types, allowed)
        if LayerType.sliding in types and cfg.sliding_window is None:
            raise ConfigError("model.sliding_window", None, "must be set when model.layer_types has sliding layers")
    if cfg.sliding_window is not None and LayerType.sliding not in resolve_layer_types(cfg):
        raise ConfigError(
            "model.sliding_window",
            cfg.sliding_window,
            "is not used: model.layer_types marks no layer sliding; mark some sliding or leave sliding_window unset",
        )
    if cfg.rotary_theta_local is not None:
        check_positive("model.rotary_theta_local", cfg.rotary_theta_local, "must be a finite number above 0 or null")
        if cfg.positions != Positions.rotary or LayerType.sliding not in resolve_layer_types(cfg):
            why = f"model.positions={cfg.positions}" if cfg.positions != Positions.rotary else "no sliding layer"
            raise ConfigError(
                "model.rotary_theta_local",
                cfg.rotary_theta_local,
                f"is the rotary base of sliding layers, and this model has {why}: leave it unset, or use rotary "
                "positions and model.sliding_window (with model.layer_types marking the sliding layers)",
            )
    check_choice("model.qk_norm", cfg.qk_norm, QKNorm)
    if cfg.qk_norm != QKNorm.none and cfg.norm == Norm.layernorm:
        raise ConfigError("model.qk_norm", cfg.qk_norm, "needs an RMS norm: model.norm=rmsnorm or rmsnorm_plus_one")
    for key, value in (
        ("model.attn.query_pre_attn_scalar", cfg.attn.query_pre_attn_scalar),
        ("model.attn.softcap", cfg.attn.softcap),
        ("model.final_softcap", cfg.final_softcap),
    ):
        if value is not None:
            check_positive(key, value, "must be a finite number above 0 or null")
