"""`path_patching`: the effect on the metric of each sender's corrupted output sent along the direct path into the
receiver set only (Wang et al. 2022; headcount/circuits/path_patching.py says what is frozen and what recomputes),
the corrupted output being the mode's (circuit_inputs.py): patch mode's counterpart prompt, resample's paired
input, or zero.

Columns: sender, receivers (the set, joined by ', '), effect (metric(patched) - metric(clean), in the metric's unit
per score point), effect_ci_low and effect_ci_high (its 95% bootstrap interval over the prompts, 1000 resamples
seeded by ablation.seed: circuits/bootstrap.py), damage (how much it worsens the metric), damage_ci_low and
damage_ci_high (the effect's interval as damage), rank (by damage, 1 first).
With receivers_together=false each receiver is its own set (a row per sender and receiver). Figures: a heatmap of
effects (senders by receiver sets) and the paths drawn as a circuit graph, arrows as wide as |effect|.
summary.json's `path_patching` entry names the path of largest damage; its `intervals.<name>` entry says how stable
the top sender heads are over the same resamples (their rows' damage added up, as another scan's `top<k>:<name>`
ranks them; n: the largest such k in the config, else 5% of the sender heads): `heads` (the full data's top n),
`mean_overlap`, `min_overlap` (findings/stability.py reads it: ioi_circuit's classes). No partial file: a killed
scan recomputes its table, in passes of as many (sender, receiver set) pairs and examples as fit
`ablation.memory_budget_mb` (circuits/passes.py).

With skip_unreached, a sender's receiver set keeps only the receivers that read it (a later layer), and a sender none
of them reads has no row: senders [heads] into receivers another scan finds, in whatever layers they are. Another
circuit scan ranks this one's sender heads by name (`top3:<this scan's name>`): by their rows' damage added up.
"""

from pathlib import Path

import numpy as np
import pandas as pd
import torch

from headcount.ablation.scans.base import KINDS, Scan, ScanResult
from headcount.ablation.scans.circuit_inputs import (
    TOP,
    check_circuit_scan,
    check_order,
    check_receivers_read_heads,
    check_sender_entries,
    check_top_count,
    circuit_inputs,
    ranked_scans,
    resolve_receivers,
    resolve_senders,
)
from headcount.ablation.scans.intervals import interval_figure, top_n
from headcount.circuits import Graph, draw_circuit, path_patch
from headcount.circuits.bootstrap import LEVEL, RESAMPLES, percentile_interval, resample_counts, top_n_stability
from headcount.circuits.shares import ExampleShare
from headcount.config.ablation import AblationConfig
from headcount.config.scans import PathPatchingSettings
from headcount.errors import ConfigError
from headcount.io import atomic_savefig
from headcount.labels import edge_label, join_names, parse_head, split_names
from headcount.plotting import new_figure, set_title

# a table computed before the damage intervals or the top senders' stability were recorded is computed again
BOOTSTRAP_RULE = (
    f"effect and damage intervals: {RESAMPLES} resamples of prompts, {LEVEL} percentile; top sender stability"
)


@KINDS.register
class PathPatchingScan(Scan):
    kind = "path_patching"
    doc = "each sender's corrupted output sent along the direct path into the receivers only (Wang et al. 2022)"
    reads = Scan.reads | {"model", "batches", "mode"}
    ranks_senders = True  # other circuit scans name its top sender heads (circuit_inputs.named_heads)
    Settings = PathPatchingSettings

    @classmethod
    def check(cls, name: str, cfg: PathPatchingSettings, settings: AblationConfig) -> None:
        check_circuit_scan(name, cfg, settings)
        for key in ("senders", "receivers"):
            if not getattr(cfg, key):
                raise ConfigError(f"ablation.scans.{name}.{key}", [], "names none: list at least one")

    def prepare(self) -> None:
        """Every name checked against the model before any work; a top-k name needs its ranking's scan, so what can
        be checked without it is: its k, a suffix on a sender, and receivers no head sends to (they would refuse
        every head the ranking names, after the ranking ran)."""
        key, graph = f"ablation.scans.{self.name}", Graph.of(self.session.model)
        check_sender_entries(self.cfg.senders, graph, f"{key}.senders")
        ranked = lambda entries: [e for e in entries if TOP.match(str(e).strip())]  # noqa: E731
        for entry in ranked(self.cfg.receivers):
            check_top_count(entry, graph, f"{key}.receivers")
        if not ranked([*self.cfg.senders, *self.cfg.receivers]):
            self.pairs()
        elif not ranked(self.cfg.receivers) and not self.cfg.skip_unreached:
            receivers = resolve_receivers(self.cfg.receivers, self.session, f"{key}.receivers")
            check_receivers_read_heads(graph, receivers, f"{key}.receivers", ", ".join(ranked(self.cfg.senders)))

    def recorded_settings(self) -> dict:
        cfg = self.cfg
        paths = {"senders": list(cfg.senders), "receivers": list(cfg.receivers)}
        return {**paths, "receivers_together": cfg.receivers_together, "skip_unreached": cfg.skip_unreached}

    def fingerprint_parts(self) -> tuple:
        cfg = self.cfg
        parts = (self.kind, list(cfg.senders), list(cfg.receivers), cfg.receivers_together)
        parts = (*parts, "skip_unreached") if cfg.skip_unreached else parts
        return (*parts, BOOTSTRAP_RULE)

    def pairs(self) -> list[tuple[list[str], list[str]]]:
        key = f"ablation.scans.{self.name}"
        senders = resolve_senders(self.cfg.senders, self.session, f"{key}.senders")
        receivers = resolve_receivers(self.cfg.receivers, self.session, f"{key}.receivers")
        graph = Graph.of(self.session.model)
        sets = [receivers] if self.cfg.receivers_together else [[r] for r in receivers]
        if not self.cfg.skip_unreached:
            check_order(graph, senders, receivers, f"{key}.receivers")
            return [([s], r) for r in sets for s in senders]
        reads = lambda s, r: graph.senders.index(graph.node(s)) < graph.n_senders(graph.receiver(r))  # noqa: E731
        pairs = [([s], [r for r in rs if reads(s, r)]) for rs in sets for s in senders]
        if not (pairs := [(s, rs) for s, rs in pairs if rs]):
            raise ConfigError(f"{key}.receivers", receivers, f"read none of the senders {', '.join(senders)}")
        return pairs

    def compute(self, key: str) -> ScanResult:
        pairs = self.pairs()
        inputs, metric = circuit_inputs(self.session, self.name)

        def effects_of(share: ExampleShare) -> dict[str, torch.Tensor]:
            args = (self.session.model, share.clean_ids_BT, share.corrupted, pairs, share.metric, share.points_BT)
            with torch.no_grad():
                return {"effect": path_patch(*args, memory_budget=inputs.memory_budget, per_example=True)}

        # (B, pairs): each example's effects, summed over the examples; shared out over a scan's processes
        per_example = self.per_example(inputs, metric, effects_of)["effect"]
        effects = per_example.sum(0)
        points_P = inputs.points_BT.sum(1).cpu()
        counts = resample_counts(len(points_P), RESAMPLES, self.session.settings.seed)
        low, high = percentile_interval(per_example, points_P, counts, LEVEL)
        table = pd.DataFrame(
            {
                "sender": [s[0] for s, _ in pairs],
                "receivers": [join_names(r) for _, r in pairs],
                "effect": (effects / inputs.n_points).numpy(),
                "effect_ci_low": low.numpy(),
                "effect_ci_high": high.numpy(),
            }
        )
        damage = self.session.metric.damage
        table["damage"] = damage(table["effect"], 0.0)
        ends = np.stack([damage(low.numpy(), 0.0), damage(high.numpy(), 0.0)])  # a decrease's damage swaps the ends
        table["damage_ci_low"], table["damage_ci_high"] = ends.min(0), ends.max(0)
        table["rank"] = table["damage"].rank(ascending=False, method="first").astype(int)
        damage_PX = self.session.metric.damage(per_example, 0.0)  # linear: each example's share of each row's damage
        stability = sender_stability([s[0] for s, _ in pairs], damage_PX, points_P, counts, self.ranked_top())
        return ScanResult(table, summary={"intervals": {self.name: stability}})

    def ranked_top(self) -> int | None:
        """The largest k of the config's `top<k>:<this scan>` entries (the heads other scans take from it); None."""
        entries = [
            entry
            for cfg in self.session.settings.scans.values()
            for field in ("senders", "receivers", "heads")
            for entry in getattr(cfg, field, None) or []
        ]
        ks = [int(top[1]) for e in entries if (top := TOP.match(str(e).strip())) and top[2] == self.name]
        return max(ks, default=None)

    def needs(self) -> list[str]:
        return ranked_scans([*self.cfg.senders, *self.cfg.receivers])

    def use(self, table: pd.DataFrame) -> None:
        self.session.hand(self.name, table)  # the scans that name its top sender heads read them from it
        top = table.loc[table["damage"].idxmax()]
        entry = {"sender": top["sender"], "receivers": top["receivers"], "effect": float(top["effect"])}
        summary = {"largest_damage": entry, "paths": len(table)}
        self.session.files.update_summary({"path_patching": {self.name: summary}})

    def figures(self, table: pd.DataFrame) -> list[Path | None]:
        metric = self.session.metric
        heatmap = effect_heatmap(
            table, self.path(".png"), self.title(f"path-patching effect on {metric.name} ({metric.unit})"), metric.unit
        )
        graph = Graph.of(self.session.model)
        weights = torch.zeros(len(graph.edges), dtype=torch.float64)
        for row in table.itertuples():
            for receiver in split_names(row.receivers):
                weights[graph.edge_index[edge_label(row.sender, receiver)]] += abs(row.effect)
        edges = set(weights.nonzero()[:, 0].tolist())
        fig = draw_circuit(graph, edges, weights, self.title("paths patched, arrows as wide as |effect|"))
        circuit = self.path(".png", "_circuit")
        atomic_savefig(fig, circuit, dpi=120)
        paths = table.assign(mask=table["sender"] + " -> " + table["receivers"])
        label, title = f"effect ({metric.unit})", self.title("path-patching effects, the largest with their intervals")
        return [heatmap, circuit, interval_figure(paths, self.path(".png", "_intervals"), title, label, "effect")]

    def file_names(self) -> list[tuple[str, str]]:
        return [*super().file_names(), ("_circuit", ".png"), ("_intervals", ".png")]


def effect_heatmap(table: pd.DataFrame, path: Path, title: str, unit: str) -> Path:
    """Effects as a grid: a row per sender, a column per receiver set, diverging around zero."""
    grid = table.pivot(index="sender", columns="receivers", values="effect")
    grid = grid.loc[list(dict.fromkeys(table["sender"])), list(dict.fromkeys(table["receivers"]))]
    fig = new_figure(2.5 + 0.9 * grid.shape[1], 2 + 0.35 * grid.shape[0])
    ax = fig.add_subplot()
    limit = float(np.nanmax(np.abs(grid.to_numpy()))) or 1.0
    image = ax.imshow(grid.to_numpy(), cmap="RdBu_r", vmin=-limit, vmax=limit, aspect="auto")
    ax.set_xticks(range(grid.shape[1]), grid.columns, rotation=45, ha="right", fontsize=7)
    ax.set_yticks(range(grid.shape[0]), grid.index, fontsize=7)
    ax.set(xlabel="receivers", ylabel="sender")
    fig.colorbar(image, ax=ax, label=f"effect ({unit})")
    set_title(ax, title)
    atomic_savefig(fig, path, dpi=120)
    return Path(path)


def sender_stability(senders: list[str], damage_PX, points_P, counts_RP, n: int | None) -> dict | str:
    """How stable the top n sender heads by damage (their rows added up) are over the resamples: the stability entry
    findings/stability.py reads, with `heads`, the full data's top n; n None: 5% of the sender heads."""
    heads = list(dict.fromkeys(s for s in senders if parse_head(s) is not None))
    n = top_n(len(heads)) if n is None else n
    if not 1 <= n <= len(heads):
        return f"{len(heads)} sender heads, fewer than the top {n}"
    columns = [i for i, s in enumerate(senders) if s in heads]
    index = torch.tensor([heads.index(senders[i]) for i in columns])
    by_head_PS = torch.zeros(damage_PX.shape[0], len(heads), dtype=torch.float64)
    by_head_PS.index_add_(1, index, damage_PX[:, columns].double())
    full = torch.sort(-by_head_PS.sum(0), stable=True).indices[:n]  # ties to the first sender, as top_sender_heads
    stability = top_n_stability(by_head_PS, points_P, counts_RP, n, magnitude=False)
    entry = {"resamples": len(counts_RP), "by": "damage", "top_n": n, "heads": [heads[i] for i in full.tolist()]}
    return entry | {k: stability[k] for k in ("mean_overlap", "min_overlap")}
