"""What an encoder-decoder (model.encoder_layers > 0) can be scanned with: its heads are one grid of three kinds
(labels.KindRows), every mask is scored by the teacher-forced metric at the decoder's target tokens, or at a
sequence-to-sequence task's (tasks/translation_verb.py: clean and corrupted sources, wrong answers, so mode=patch and
logit_diff), so the scans that switch heads off by masks run on it; what reads one stack's residual stream, a
decoder's task prompts or its edges is refused in one line, naming the scan and what an encoder-decoder takes."""

from headcount.config.ablation import AblationConfig
from headcount.errors import ConfigError

SEQ2SEQ_SCANS = (
    "baseline",
    "single_head",
    "layer",
    "leave_one_in",
    "custom",
    "importance",
    "pruning",
    "l0_gates",
    "pairs",
    "top_heads",
    "attribution",
)

# Scan kinds an encoder-decoder does not take, and why.
NOT_ON_SEQ2SEQ = {
    "path_patching": "its circuits are defined on a decoder's task prompts, not through cross-attention",
    "edge_attribution": "its circuits are defined on a decoder's task prompts, not through cross-attention",
    "direct_effect": "a head's direct effect reads one stack's residual stream into the logits",
    "head_scores": "its previous-token and induction scores read a one-stack decoder's pattern",
    "position_attention": "it reads attention from a task prompt's scored position",
    "retrieval_scores": "it reads a copying task's next-token predictions",
    "head_circuit": "its circuit is built from a decoder's task prompts",
    "kv_groups": "its masks are one stack's key/value groups",
}
PRUNE_HEADS_REASON = (
    "[layer, head] pairs cannot say a head's kind (enc, dec or cross); on an encoder-decoder the export removes the "
    "heads a pruning order or the l0_gates scan chooses (ablation.prune.order, ablation.prune.fraction)"
)
NOT_YET = "it is not defined on an encoder-decoder's three kinds of heads"


def seq2seq_modes() -> list[str]:
    """The modes an encoder-decoder takes without a task: those that need no task's prompts."""
    from headcount.ablation.engine.modes import MODES

    return [name for name in MODES.names() if MODES[name].needs_task is None]


def seq2seq_sources() -> list[str]:
    """The task sources that score an encoder-decoder's teacher-forced target given a source (tasks/)."""
    from headcount.tasks import SOURCES

    return [name for name in SOURCES.names() if SOURCES[name].seq2seq]


def takes() -> str:
    return (
        f"an encoder-decoder is scored at its teacher-forced targets and takes the scans {', '.join(SEQ2SEQ_SCANS)} "
        f"in modes {', '.join(seq2seq_modes())}, and with its tasks ({', '.join(seq2seq_sources())}) mode=patch "
        "and the metrics that read wrong answers too"
    )


def refuse_one_stack_only(settings: AblationConfig, task_source: str | None, several_processes: bool = False) -> None:
    """ConfigError for a task, scan, mode, metric, export choice or process count an encoder-decoder cannot be scanned
    with."""
    seq2seq_task = task_source in seq2seq_sources()
    if task_source is not None and not seq2seq_task:
        raise ConfigError("task.source", task_source, f"a decoder's task scores a decoder's prompts; {takes()}")
    if seq2seq_task and settings.patch_positions == "each":
        allowed = f"an encoder-decoder's task names no positions: use all; {takes()}"
        raise ConfigError("ablation.patch_positions", "each", allowed)
    for name, scan in settings.scans.items():
        if scan.kind not in SEQ2SEQ_SCANS:
            raise ConfigError(
                f"ablation.scans.{name}.kind", scan.kind, f"{NOT_ON_SEQ2SEQ.get(scan.kind, NOT_YET)}; {takes()}"
            )
        rank_by = getattr(scan, "rank_by", None)  # top_heads' ranking scan runs too
        if rank_by is not None and rank_by not in SEQ2SEQ_SCANS:
            raise ConfigError(
                f"ablation.scans.{name}.rank_by", rank_by, f"{NOT_ON_SEQ2SEQ.get(rank_by, NOT_YET)}; {takes()}"
            )
    if settings.mode not in seq2seq_modes() and not seq2seq_task:
        raise ConfigError("ablation.mode", settings.mode, takes())
    from headcount.ablation.engine.metrics import METRICS

    metric = settings.metric
    if not seq2seq_task and isinstance(metric, str) and metric in METRICS and METRICS[metric].needs_wrong:
        allowed = ", ".join(name for name in METRICS if not METRICS[name].needs_wrong)
        raise ConfigError(
            "ablation.metric", metric, f"needs a task's wrong answers; an encoder-decoder's targets take {allowed}"
        )
    if settings.prune.export and settings.prune.heads is not None:
        raise ConfigError("ablation.prune.heads", settings.prune.heads, PRUNE_HEADS_REASON)
    if several_processes:
        raise ConfigError(
            "trainer.devices", "several processes", f"an encoder-decoder's scans run in one process; {takes()}"
        )


def refuse_seq2seq_edges(what: str) -> None:
    """ConfigError for an edge evaluation (edges_removed, circuit, circuit_performance) on an encoder-decoder."""
    allowed = "edges and circuits are defined on a decoder's task prompts; an encoder-decoder takes head masks "
    raise ConfigError(
        what, "on an encoder-decoder", allowed + "(masks=..., heads named enc.L1H3, dec.L1H3, cross.L1H3)"
    )
