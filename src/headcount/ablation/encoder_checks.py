"""What an encoder (model.causal=false) can be scanned with: its metric is read at masked-LM points
(train/masking.py) or at a masked-LM task's [MASK] positions (tasks/masked_agreement.py), so every scan that switches
heads off or patches edges and reads that metric runs on it (circuits/ is exact on bidirectional attention), and what
reads a decoder's next-token prompts or causal patterns is refused in one line, naming the scan and what an encoder
takes; a masked-LM task on a decoder likewise."""

from headcount.config.ablation import AblationConfig
from headcount.errors import ConfigError

# Scan kinds that assume a decoder, and why.
DECODER_ONLY = {
    "head_scores": "its previous-token and induction scores read a causal pattern",
    "position_attention": "it reads attention from a task prompt's scored position",
    "retrieval_scores": "it reads a copying task's next-token predictions",
    "direct_effect": "a masked-LM head's transform is not linear in the stream",
}


def encoder_scans() -> list[str]:
    from headcount.ablation.scans import KINDS

    return [kind for kind in KINDS if kind not in DECODER_ONLY]


def masked_lm_sources() -> list[str]:
    """The task sources that score an encoder's mask positions."""
    from headcount.tasks import SOURCES

    return [name for name in SOURCES.names() if SOURCES[name].masked_lm]


def refuse_decoder_only(
    settings: AblationConfig, task_source: str | None, causal: bool, encoder_decoder: bool = False
) -> None:
    """ConfigError for a task, a scan or a metric an encoder cannot be scored by, a masked-LM task on a decoder, or
    an encoder-decoder's task on a model without a source to read."""
    from headcount.ablation.seq2seq_checks import seq2seq_sources

    if task_source in seq2seq_sources() and not encoder_decoder:
        model = "a decoder (model.causal=true)" if causal else "an encoder (model.causal=false)"
        allowed = f"scores an encoder-decoder's target given a source (model.encoder_layers > 0); this model is {model}"
        raise ConfigError("task.source", task_source, allowed)
    masked = task_source in masked_lm_sources()
    if causal:
        if masked:
            allowed = "scores an encoder's [MASK] positions (model.causal=false); a decoder takes next-token tasks"
            raise ConfigError("task.source", task_source, allowed)
        return
    scans = ", ".join(encoder_scans())
    takes = f"an encoder (model.causal=false) is scored at masked-LM points and takes the scans {scans}"
    if task_source is not None and not masked:
        tasks = ", ".join(masked_lm_sources())
        raise ConfigError(
            "task.source",
            task_source,
            f"a task scores next-token answers of a decoder; {takes}, and the masked-LM tasks {tasks}",
        )
    for name, scan in settings.scans.items():
        if scan.kind in DECODER_ONLY:
            raise ConfigError(f"ablation.scans.{name}.kind", scan.kind, f"{DECODER_ONLY[scan.kind]}; {takes}")
    from headcount.ablation.engine.metrics import METRICS

    metric = settings.metric
    if not masked and isinstance(metric, str) and metric in METRICS and METRICS[metric].needs_wrong:
        allowed = ", ".join(name for name in METRICS if not METRICS[name].needs_wrong)
        raise ConfigError(
            "ablation.metric", metric, f"needs a task's wrong answers; an encoder's masked-LM points take {allowed}"
        )


def refuse_edges(model) -> None:
    """ConfigError for an edge evaluation (edges_removed, circuit, circuit_performance) on a model with
    cross-attention (an encoder-decoder): decoders and encoders take edges (circuits/graph.py)."""
    from headcount.circuits.graph import refuse_cross_attention

    refuse_cross_attention(model)
