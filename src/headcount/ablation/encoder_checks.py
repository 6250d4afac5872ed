"""What an encoder (model.causal=false) can be scanned with: its metric is read at masked-LM points
(train/masking.py), so every scan that switches heads off and reads that metric runs on it, and what reads a decoder's
next-token prompts or causal patterns is refused in one line, naming the scan and what an encoder takes."""

from headcount.config.ablation import AblationConfig
from headcount.errors import ConfigError

# Scan kinds that assume a decoder, and why.
DECODER_ONLY = {
    "head_scores": "its previous-token and induction scores read a causal pattern",
    "position_attention": "it reads attention from a task prompt's scored position",
    "retrieval_scores": "it reads a copying task's next-token predictions",
    "path_patching": "its circuits are defined on a decoder's task prompts",
    "edge_attribution": "its circuits are defined on a decoder's task prompts",
    "direct_effect": "a masked-LM head's transform is not linear in the stream",
}


def encoder_scans() -> list[str]:
    from headcount.ablation.scans import KINDS

    return [kind for kind in KINDS if kind not in DECODER_ONLY]


def refuse_decoder_only(settings: AblationConfig, task_source: str | None, causal: bool) -> None:
    """ConfigError for a task, a scan or a metric an encoder cannot be scored by; nothing for a decoder."""
    if causal:
        return
    scans = ", ".join(encoder_scans())
    takes = f"an encoder (model.causal=false) is scored at masked-LM points and takes the scans {scans}"
    if task_source is not None:
        raise ConfigError("task.source", task_source, f"a task scores next-token answers of a decoder; {takes}")
    for name, scan in settings.scans.items():
        if scan.kind in DECODER_ONLY:
            raise ConfigError(f"ablation.scans.{name}.kind", scan.kind, f"{DECODER_ONLY[scan.kind]}; {takes}")
    from headcount.ablation.engine.metrics import METRICS

    metric = settings.metric
    if isinstance(metric, str) and metric in METRICS and METRICS[metric].needs_wrong:
        allowed = ", ".join(name for name in METRICS if not METRICS[name].needs_wrong)
        raise ConfigError(
            "ablation.metric", metric, f"needs a task's wrong answers; an encoder's masked-LM points take {allowed}"
        )


def refuse_edges(what: str, causal: bool) -> None:
    """ConfigError for an edge evaluation (edges_removed, circuit, circuit_performance) on an encoder: the circuits
    core patches a decoder's task prompts."""
    if not causal:
        allowed = "edges and circuits are defined on a decoder's task prompts; an encoder (model.causal=false) takes "
        raise ConfigError(what, "on an encoder", allowed + "head masks (masks=...) scored at masked-LM points")
