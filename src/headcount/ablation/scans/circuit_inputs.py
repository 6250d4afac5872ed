"""What the circuit scans (path_patching, edge_attribution) hand the circuits core (headcount/circuits/): the clean
prompts, the corrupted run, the score points and the metric, from the session; and the senders and receivers a
scan's config names.

- Prompts: the examples the session's evaluation batches are views of (data/examples.py `ExampleBatches`: split
  once, where they enter), right-padded to the longest (causal attention keeps the padding out of every scored
  position; an encoder's attention would read it, so there prompts of different lengths are refused), scored at their
  score points (a (B, T) mask: a task's scored position, or language modelling's every target token).
- The corrupted run, by mode: patch and resample run the model on each example's source (its counterpart prompt, or
  the reference input it is paired with), so an edge carries the sender's output on that input; zero makes every
  sender's output zero (the embeddings, each head's z, each MLP's output), as zero ablation does to a head's z. mean
  is refused: its replacement exists only for heads' z, and an edge from the embeddings or an MLP needs one too.
- The metric: the session's metric object read at the score points, summed in float64 (a PointMetric: the core
  evaluates a share of the examples per pass and hands it those points' answers); tables divide by the number of
  points, so scores are in the metric's unit per point, as every other scan reports.
- Processes: `CircuitInputs.per_example` runs an evaluation that gives one row per example on every example, or on
  each process's share of them in a scan over several (ablation/records/distributed.py); the scans sum its rows.
- Passes: sized to `ablation.memory_budget_mb`, the budget the evaluator's passes are sized to (None: its default).
- Names: node and receiver names as the circuits graph spells them (L0H1, L1H0.k), a layer's heads (L2, or L2.q for
  their queries), every head of the model (heads, heads.v), or another scan kind's top k heads (top3:direct_effect,
  top3:direct_effect.q), read through the session's `provided`; or the top k sender heads of one of the session's
  path_patching scans, by its name (top3:s_inhibition.v: the 3 heads whose paths into its receivers do most damage).
"""

import re
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from headcount.ablation.engine.heads import top_heads
from headcount.ablation.engine.metrics import Readout, Targets
from headcount.ablation.engine.modes import MODES, AblationMode, Zero
from headcount.ablation.records.distributed import per_example_tables
from headcount.ablation.scans.base import KINDS, ScanSettings
from headcount.circuits import Graph, NodeOutputs, PointMetric
from headcount.circuits.graph import QKV
from headcount.circuits.shares import ExampleShare
from headcount.config.ablation import AblationConfig
from headcount.data.examples import ExampleBatches
from headcount.errors import ConfigError
from headcount.labels import input_label, parse_head

LAYER = re.compile(r"^L(\d+)(?:\.([qkv]))?$")
EVERY_HEAD = re.compile(r"^heads(?:\.([qkv]))?$")
TOP = re.compile(r"^top(\d+):(\w+)(?:\.([qkv]))?$")


def corrupted_run(mode: type[AblationMode]) -> str | None:
    """How a mode corrupts every sender: "source" (each example's source input, run through the model: patch and
    resample), "all zeros", or None (a replacement for heads' z alone: mean)."""
    if mode.per_example:
        return "source"
    return "all zeros" if issubclass(mode, Zero) else None


def check_edge_mode(mode: str, key: str, what: str) -> None:
    """A one-line ConfigError for a mode without a corrupted run of every sender (mean), naming `what` needs one."""
    if corrupted_run(MODES.get(mode, key)) is None:
        usable = [name for name in MODES.names() if corrupted_run(MODES[name]) is not None]
        raise ConfigError(
            key,
            mode,
            f"{what} needs every sender's replacement output (the embeddings' and MLPs' too): "
            f"use one of {', '.join(usable)}",
        )


def check_circuit_scan(name: str, cfg: ScanSettings, settings: AblationConfig) -> None:
    """The checks that need no model: a mode with a corrupted run, and the top-k names' kinds."""
    check_edge_mode(settings.mode, "ablation.mode", f"the {name} scan")
    for key in ("senders", "receivers"):
        if hasattr(cfg, key):  # edge_attribution takes receivers alone
            check_top_names(name, getattr(cfg, key), settings, f"ablation.scans.{name}.{key}")


def check_top_names(name: str, entries: list[str], settings: AblationConfig, key: str) -> None:
    """Each top-k entry names a scan kind that ranks heads, or another of the session's scans that ranks its
    senders (a path_patching scan)."""
    for entry in entries:
        top = TOP.match(str(entry).strip())
        if not top:
            continue
        if int(top[1]) < 1:
            raise ConfigError(key, entry, f"k must be at least 1: top<k>:{top[2]} names its k highest-ranked heads")
        if top[2] == name:
            raise ConfigError(key, entry, "names this scan itself: a scan cannot rank its own inputs")
        senders_ranked = [
            other
            for other, scan in settings.scans.items()
            if other != name and getattr(KINDS.get(scan.kind, f"ablation.scans.{other}.kind"), "ranks_senders", False)
        ]
        if top[2] in senders_ranked or (top[2] in KINDS and KINDS[top[2]].ranks_heads):
            continue
        rankers = ", ".join(kind for kind in KINDS if KINDS[kind].ranks_heads)
        raise ConfigError(
            key,
            entry,
            f"{top[2]} ranks no heads: name a scan kind that does ({rankers}) or a path_patching scan of this session"
            f" ({', '.join(senders_ranked) or 'none'})",
        )


class LogitsReadout(Readout):
    """A Readout of logits already computed (the circuits core's), so headcount's metrics read them unchanged."""

    def __init__(self, logits_PV: Tensor, answer_P: Tensor, wrong_P: Tensor | None):
        self.answer_N, self.wrong_N, self.normed_NC = answer_P, wrong_P, logits_PV
        self.__dict__["logits_NV"] = logits_PV


@dataclass
class CircuitInputs:
    clean_ids_BT: Tensor
    corrupted: Tensor | NodeOutputs  # the corrupted run's ids, or its outputs given directly (zero)
    points_BT: Tensor  # the score points
    n_points: int
    memory_budget: int | None  # bytes of activations per pass (None: the default budget)

    def metric(self, metric, targets: Targets, column: int = 0) -> PointMetric:
        """The core's metric: the session metric's column `column` (0: the primary) at the points it is called on."""

        def values(logits_PV: Tensor, answer_P: Tensor, wrong_P: Tensor | None) -> Tensor:
            return metric.values(LogitsReadout(logits_PV, answer_P, wrong_P))[:, column]

        return PointMetric(values, targets.answer_N, targets.wrong_N)

    def per_example(self, world, metric, compute: Callable[[ExampleShare], dict[str, Tensor]]) -> dict[str, Tensor]:
        """compute's per-example tables (float64, on the CPU) of every example: computed here, or each process of
        `world` (a ScanWorld, None: this one alone) computing its share of the examples (circuits/shares.py)."""

        def share(examples: slice) -> dict[str, Tensor]:
            return compute(ExampleShare.of(self.clean_ids_BT, self.corrupted, self.points_BT, metric, examples))

        return per_example_tables(world, len(self.clean_ids_BT), share)


def circuit_inputs(session, scan_name: str) -> tuple[CircuitInputs, object]:
    """The clean ids, the corrupted run, the score points and the core metric callable of the session."""
    inputs, targets = edge_inputs(
        session.batches, session.mode, session.model, session.settings.memory_budget_mb, f"ablation.scans.{scan_name}"
    )
    return inputs, inputs.metric(session.metric, targets)


def edge_inputs(
    batches: ExampleBatches, mode: AblationMode, model, memory_budget_mb: int | None, key: str
) -> tuple[CircuitInputs, Targets]:
    """The circuits core's inputs from evaluation batches prepared by `mode` (a scan session's, or Run.evaluate's),
    and their score points' targets; `key` names what a task whose prompts are shifted is refused for. The core
    takes the examples whole, as the batches hold them (data/examples.py): not joined again, not copied."""
    batch = {
        k: v for k, v in batches.examples.items() if v.ndim == 2
    }  # the (B, T) tensors; (B,) ones are the evaluator's
    if "source_pos" in batch:
        raise ConfigError(
            key,
            "source_pos",
            "edges need clean and corrupted prompts aligned position by position; this task shifts them "
            "(task.align=last with prompts of different lengths)",
        )
    if not model.cfg.causal and "valid" in batch and not bool(batch["valid"].all()):
        raise ConfigError(
            key,
            "prompts of different lengths",
            "an encoder (model.causal=false) attends to every position, the padding too: give its prompts one length",
        )
    ids = batch["input_ids"]
    corrupted = zero_outputs(model, ids) if corrupted_run(type(mode)) == "all zeros" else batch["source_ids"]
    targets = Targets.of(batch)
    budget = None if memory_budget_mb is None else memory_budget_mb * 2**20
    return CircuitInputs(ids, corrupted, targets.where_BT, len(targets), budget), targets


def zero_outputs(model, ids_BT: Tensor) -> NodeOutputs:
    """Every sender's output zero, as views of one zero (no memory per example; passes copy their share)."""
    param = next(model.parameters())
    zero = torch.zeros((), dtype=param.dtype, device=param.device)
    B, T, C = *ids_BT.shape, model.cfg.d_model
    z = [zero.expand(B, T, block.attn.n_heads, block.attn.head_dim) for block in model.blocks]
    mlp = [zero.expand(B, T, C) for block in model.blocks if block.mlp is not None]
    return NodeOutputs(zero.expand(B, T, C), z, mlp)


def named_heads(entry: str, session, key: str) -> list[str] | None:
    """An entry naming heads by layer or by another scan's top k, as head names (with its input suffix); None for a
    plain node or receiver name."""
    graph, text = Graph.of(session.model), entry.strip()
    if every := EVERY_HEAD.match(text):
        every_head = [(n, h) for n in range(graph.n_layers) for h in range(graph.heads_per_layer[n])]
        return [input_label(n, h, every[1]) for n, h in every_head]
    if layer := LAYER.match(text):
        n = int(layer[1])
        if n >= graph.n_layers:
            raise ConfigError(key, entry, f"no layer {n}: the model has layers 0..{graph.n_layers - 1}")
        return [input_label(n, h, layer[2]) for h in range(graph.heads_per_layer[n])]
    if top := TOP.match(text):
        check_top_count(entry, graph, key)
        ranking = session.settings.scans.get(top[2])
        if ranking is not None and getattr(KINDS[ranking.kind], "ranks_senders", False):  # a path_patching scan
            heads = top_sender_heads(session.provided(top[2]), int(top[1]))
            if not heads:
                raise ConfigError(key, entry, f"{top[2]}'s table has no head among its senders to rank")
            return [input_label(*parse_head(h), top[3]) for h in heads]
        score_LH = session.provided(top[2])
        return [input_label(n, h, top[3]) for n, h in top_heads(score_LH, graph.heads_per_layer, int(top[1]))]
    return None


def ranked_scans(entries: list[str]) -> list[str]:
    """The scans top-k entries rank by (top3:direct_effect.q: direct_effect), each once: what a circuit scan needs."""
    return list(dict.fromkeys(top[2] for entry in entries if (top := TOP.match(str(entry).strip()))))


def top_sender_heads(table, k: int) -> list[str]:
    """A path_patching table's k sender heads of largest damage, added up over their rows (largest first)."""
    heads = table[table["sender"].map(lambda s: parse_head(s) is not None)]
    damage = heads.groupby("sender", sort=False)["damage"].sum()
    return damage.sort_values(ascending=False, kind="stable").index[:k].tolist()


def check_top_count(entry: str, graph: Graph, key: str) -> None:
    """A one-line ConfigError for top<k>:... with k above the model's heads (it was cut to every head, silently)."""
    top = TOP.match(str(entry).strip())
    n_heads = sum(graph.heads_per_layer)
    if top and int(top[1]) > n_heads:
        raise ConfigError(key, entry, f"k must be at most the model's {n_heads} heads")


def check_sender_entries(entries: list[str], graph: Graph, key: str) -> None:
    """The checks on sender names that need the model's shape but no scan: an input suffix (heads.v, L2.q, top3:x.q)
    names receiver inputs, not senders; a top-k asks for no more heads than the model has."""
    for entry in entries:
        text = str(entry).strip()
        for pattern in (EVERY_HEAD, LAYER, TOP):
            if (match := pattern.match(text)) and match.groups()[-1]:
                raise ConfigError(
                    key,
                    entry,
                    f"names heads' .{match.groups()[-1]} inputs, which receive: a sender is an output (emb, L0H1, "
                    "L0.mlp, a layer L0, heads, top3:direct_effect); drop the suffix",
                )
        check_top_count(text, graph, key)


def check_receivers_read_heads(graph: Graph, receivers: list[str], key: str, senders: str) -> None:
    """A one-line ConfigError for a receiver that reads no head (a layer-0 head's input) when the senders are heads
    named by a ranking: refused before the ranking's scan runs, which no head it can name would reach."""
    for r in receivers:
        if not any(s.kind == "head" for s in graph.senders[: graph.n_senders(graph.receiver(r))]):
            raise ConfigError(key, r, f"reads no head, so none of the heads {senders} names can send to it")


def resolve_senders(entries: list[str], session, key: str) -> list[str]:
    graph, names = Graph.of(session.model), []
    check_sender_entries(entries, graph, key)
    for entry in entries:
        for name in named_heads(str(entry), session, key) or [str(entry).strip()]:
            node = graph.node(name, key)
            if node.kind == "logits":
                raise ConfigError(key, name, "the logits send to nothing; senders are emb, heads and MLPs")
            names.append(node.name)
    return list(dict.fromkeys(names))


def resolve_receivers(entries: list[str], session, key: str) -> list[str]:
    graph, names = Graph.of(session.model), []
    for entry in entries:
        heads = named_heads(str(entry), session, key)
        if heads is not None and not any(h.endswith(tuple(f".{w}" for w in QKV)) for h in heads):
            heads = [f"{h}.{w}" for h in heads for w in QKV]  # a layer or top k without a suffix: all three inputs
        for name in heads or [str(entry).strip()]:
            names.append(graph.receiver(name, key).name)
    return list(dict.fromkeys(names))


def check_order(graph: Graph, senders: list[str], receivers: list[str], key: str) -> None:
    """A one-line ConfigError for a receiver that does not read a sender (at or before its layer)."""
    for s in senders:
        for r in receivers:
            if graph.senders.index(graph.node(s)) >= graph.n_senders(graph.receiver(r)):
                raise ConfigError(key, r, f"comes before its sender {s}: a receiver must read a later layer's input")
