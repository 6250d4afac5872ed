"""What an encoder-decoder (model.encoder_layers > 0) can be scanned with: its heads are one grid of three kinds
(labels.KindRows), every mask is scored by the teacher-forced metric at the decoder's target tokens, or at a
sequence-to-sequence task's (tasks/translation_verb.py: clean and corrupted sources, wrong answers, so mode=patch and
logit_diff), so the scans that switch heads off by masks run on it; what reads one stack's residual stream, a
decoder's task prompts or its edges is refused in one line, naming the scan and what an encoder-decoder takes."""

from headcount.config.ablation import AblationConfig
from headcount.errors import ConfigError

# Scan kinds an encoder-decoder does not take, and why.
NOT_ON_SEQ2SEQ = {
    "path_patching": "the scan is not defined through cross-attention yet; an encoder-decoder's path patching is "
    "headcount.circuits.seq2seq_path_patch in Python",
    "edge_attribution": "the scan is not defined through cross-attention yet; an encoder-decoder's exact, EAP and "
    "EAP-IG edge scores and faithfulness are headcount.circuits.seq2seq_* in Python",
    "retrieval_scores": "it reads a copying task's next-token predictions",
}
PRUNE_HEADS_REASON = (
    "[layer, head] pairs cannot say a head's kind (enc, dec or cross); on an encoder-decoder the export removes the "
    "heads a pruning order or the l0_gates scan chooses (ablation.prune.order, ablation.prune.fraction)"
)


def seq2seq_scans() -> list[str]:
    """The scan kinds an encoder-decoder takes: every kind but those refused above, so a new kind runs on it unless
    it is listed there."""
    from headcount.ablation.scans import KINDS

    return [kind for kind in KINDS if kind not in NOT_ON_SEQ2SEQ]


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
        f"an encoder-decoder is scored at its teacher-forced targets and takes the scans {', '.join(seq2seq_scans())} "
        f"in modes {', '.join(seq2seq_modes())}, and with its tasks ({', '.join(seq2seq_sources())}) mode=patch "
        "and the metrics that read wrong answers too"
    )


def refuse_one_stack_only(settings: AblationConfig, task_source: str | None) -> None:
    """ConfigError for a task, scan, mode, metric or export choice an encoder-decoder cannot be scanned with."""
    seq2seq_task = task_source in seq2seq_sources()
    if task_source is not None and not seq2seq_task:
        raise ConfigError("task.source", task_source, f"a decoder's task scores a decoder's prompts; {takes()}")
    if seq2seq_task and settings.patch_positions == "each":
        allowed = f"an encoder-decoder's task names no positions: use all; {takes()}"
        raise ConfigError("ablation.patch_positions", "each", allowed)
    for name, scan in settings.scans.items():
        if scan.kind in NOT_ON_SEQ2SEQ:
            raise ConfigError(f"ablation.scans.{name}.kind", scan.kind, f"{NOT_ON_SEQ2SEQ[scan.kind]}; {takes()}")
        rank_by = getattr(scan, "rank_by", None)  # top_heads' ranking scan runs too
        if rank_by in NOT_ON_SEQ2SEQ:
            raise ConfigError(f"ablation.scans.{name}.rank_by", rank_by, f"{NOT_ON_SEQ2SEQ[rank_by]}; {takes()}")
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


def refuse_seq2seq_edges(what: str) -> None:
    """ConfigError for an edge evaluation (edges_removed, circuit, circuit_performance) on an encoder-decoder."""
    allowed = "edges and circuits are defined on a decoder's task prompts; an encoder-decoder takes head masks "
    raise ConfigError(
        what, "on an encoder-decoder", allowed + "(masks=..., heads named enc.L1H3, dec.L1H3, cross.L1H3)"
    )
