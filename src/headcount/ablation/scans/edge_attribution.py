"""`edge_attribution`: every edge's effect on the metric estimated at once by EAP (Syed et al. 2023) and EAP-IG
(Hanna et al. 2024, `steps` interpolations), the `verify_top_k` largest EAP estimates (or, with exact_all, every
edge) evaluated exactly by the edge-patched forward (headcount/circuits/attribution.py), in the mode's corrupted run
(circuit_inputs.py). `receivers` restricts the table to the edges into those receiver inputs (all edges: none).

Columns: edge, sender, receiver, eap, eap_ig, exact (empty unless evaluated), rank (by |eap|, 1 first), verified,
in_circuit (the `circuit_size` edges of largest |score| by the best score every edge of the model has: exact when
every edge has an exact score, with exact_all and no receivers or verify_top_k at least the number of edges, else
EAP-IG; pruned to those on a path from the embeddings to the logits), circuit_by (that score's column), then
eap_ci_low, eap_ci_high, eap_ig_ci_low, eap_ig_ci_high, exact_ci_low, exact_ci_high (95% percentile intervals of
each score over 1000 resamples of the prompts, seeded by the run's seed: circuits/bootstrap.py) and top_share (the
share of resamples whose top circuit_size edges by |circuit_by| hold the edge); scores in the metric's unit per
score point. A second table, `<name>_faithfulness.csv`, holds the faithfulness curve: for EAP,
EAP-IG, exact (when every edge has it) and `random_sets` random edge sets, the faithfulness of the top-n circuit
against n, at the sizes asked for and at MIB's (0.1% .. 100% of the edges, circuits/cpr.py). A third,
`<name>_cpr.csv`, holds each method's (and random draw's) CPR and CMD, MIB's areas under that curve at its sizes;
both tables have 95% percentile intervals over the same resamples of the prompts (curve: ci_low, ci_high; areas:
cpr_ci_low, cpr_ci_high, cmd_ci_low, cmd_ci_high), drawn as error bars on the figure.
summary.json's `edge_attribution` entry has the Spearman correlation and top-k recall of EAP and EAP-IG against the
exact scores (when every edge is exact and k is below the number of edges); its `edge_circuits` entry the circuit's
size, the score that chose it (`circuit_by`), its faithfulness and, under `mib`, each method's CPR and CMD (random:
the draws' mean, lowest and highest) and, under `stability`, the mean and lowest overlap of the resamples' top
circuit_size edges with the full data's. Figures: the faithfulness curve (each method labelled with its CPR and CMD) and
the circuit drawn (titled with its score and faithfulness; an edge whose removal helps the metric dashed), and
`<name>_intervals.png`: the 20 edges of largest |circuit_by| with their intervals, titled with the circuit's stability.
`ablation.task_seeds` (ablation/task_seeds.py) compares the top circuit_size edges by |circuit_by| across seeds of
the task generator too: <name>_seed_stability.csv and .png, summary.json's `seed_stability.<name>`.
`methods` adds edge pruning (`edge_pruning`: hard-concrete masks on every edge trained with Lightning to
`edge_pruning.target_sparsity`, optionally warm-started from EAP-IG; ablation/methods/edge_pruning.py) and the
`ensemble` (the mean of EAP's, EAP-IG's and edge pruning's rank-normalised |scores|, circuits/ensemble.py): columns
edge_pruning (log_alpha above the lowest edge's), edge_pruning_log_alpha, edge_pruning_kept (the learned circuit) and
ensemble, their curves, CPR and CMD beside the others', and under summary.json's edge_circuits.<name>.edge_pruning the
learned circuit's size and exactly measured faithfulness (no per-prompt score intervals: they are no sums over
prompts; their circuits' faithfulness, CPR and CMD have intervals as every method's do).
Passes are sized to `ablation.memory_budget_mb` (circuits/passes.py): examples and weight rows (EAP-IG: steps) split
so that a pass fits, the sums exact whatever the split. No partial file: a killed scan recomputes its table (one
backward for EAP and for EAP-IG, one edge-patched forward row per exact edge).
"""

from dataclasses import asdict
from pathlib import Path

import pandas as pd
import torch

from headcount.ablation.engine.metrics import require_differentiable
from headcount.ablation.methods.edge_pruning import edge_pruning
from headcount.ablation.scans.base import KINDS, Scan, ScanResult
from headcount.ablation.scans.circuit_inputs import (
    TOP,
    check_circuit_scan,
    check_top_count,
    circuit_inputs,
    ranked_scans,
    resolve_receivers,
)
from headcount.ablation.scans.intervals import interval_figure
from headcount.circuits import (
    Graph,
    draw_circuit,
    eap_ig_scores,
    eap_scores,
    exact_edge_scores,
    mib_sizes,
    ranking_agreement,
    top_edges,
)
from headcount.circuits.bootstrap import LEVEL, RESAMPLES, resample_counts, score_intervals, top_n_stability
from headcount.circuits.cpr import area_intervals, faithfulness_intervals, method_areas, mib_areas, mib_points
from headcount.circuits.ensemble import ensemble_scores
from headcount.circuits.faithfulness import circuit_metrics, curve_circuits, curve_table, faithfulness, ratios
from headcount.circuits.shares import ExampleShare
from headcount.config.ablation import AblationConfig
from headcount.config.scans import EdgeAttributionSettings, check_edge_methods, check_edge_pruning
from headcount.errors import ConfigError
from headcount.io import atomic_savefig
from headcount.plotting import new_figure, set_title

FAITHFULNESS = "_faithfulness"  # the detail in the name of the result's second table, <name>_faithfulness.csv
CPR = "_cpr"  # and of its third, <name>_cpr.csv: each method's CPR and CMD (MIB)
CIRCUIT_RULE = "circuit_by: exact where every edge has an exact score, else eap_ig"
MIB_RULE = "curve at MIB's sizes too; cpr, cmd"  # a table written before CPR lacks MIB's sizes: computed again
BOOTSTRAP_RULE = f"bootstrap: {RESAMPLES} resamples of prompts, {LEVEL} percentile intervals"
METHOD_COLOURS = {
    "eap": "tab:blue",
    "eap_ig": "tab:orange",
    "exact": "black",
    "random": "tab:gray",
    "edge_pruning": "tab:green",
    "ensemble": "tab:purple",
}


@KINDS.register
class EdgeAttributionScan(Scan):
    kind = "edge_attribution"
    doc = "every edge's effect estimated at once (EAP, EAP-IG), the top k checked exactly; faithfulness curves"
    reads = Scan.reads | {"model", "batches", "mode"}
    Settings = EdgeAttributionSettings

    @classmethod
    def check(cls, name: str, cfg: EdgeAttributionSettings, settings: AblationConfig) -> None:
        check_circuit_scan(name, cfg, settings)
        require_differentiable(settings.metric, f"the {name} scan (edge attribution)")
        key = f"ablation.scans.{name}"
        if not (isinstance(cfg.steps, int) and cfg.steps >= 1):
            raise ConfigError(f"{key}.steps", cfg.steps, "EAP-IG needs an integer number of steps >= 1")
        for what in ("verify_top_k", "circuit_size", "random_sets"):
            if getattr(cfg, what) < 0:
                raise ConfigError(f"{key}.{what}", getattr(cfg, what), "must be 0 or more")
        if cfg.circuit_sizes is not None and (not cfg.circuit_sizes or min(cfg.circuit_sizes) < 0):
            raise ConfigError(f"{key}.circuit_sizes", cfg.circuit_sizes, "must list sizes >= 0, or be null")
        check_edge_methods(list(cfg.methods), f"{key}.methods")
        if "edge_pruning" in cfg.methods:
            check_edge_pruning(cfg.edge_pruning, f"{key}.edge_pruning")

    def needs(self) -> list[str]:
        return ranked_scans(self.cfg.receivers)

    def prepare(self) -> None:
        """Every receiver name checked against the model; a top-k name needs its ranking, which runs before this
        scan (`needs`), so only its k is checked here."""
        key, graph = f"ablation.scans.{self.name}.receivers", Graph.of(self.session.model)
        ranked = [entry for entry in self.cfg.receivers if TOP.match(str(entry).strip())]
        for entry in ranked:
            check_top_count(entry, graph, key)
        resolve_receivers([entry for entry in self.cfg.receivers if entry not in ranked], self.session, key)
        n_edges = len(Graph.of(self.session.model).edges)
        for n in self.cfg.circuit_sizes or []:
            if n > n_edges:
                raise ConfigError(f"ablation.scans.{self.name}.circuit_sizes", n, f"above the model's {n_edges} edges")

    def fingerprint_parts(self) -> tuple:
        cfg = self.cfg
        sizes = None if cfg.circuit_sizes is None else list(cfg.circuit_sizes)
        parts = (cfg.steps, cfg.verify_top_k, cfg.exact_all, cfg.circuit_size, sizes, cfg.random_sets)
        # CIRCUIT_RULE: tables chosen by the earlier rule (EAP-IG unless exact_all over every edge) are computed again
        # the methods beyond EAP, EAP-IG and exact only where asked: a table computed without them stays up to date
        methods = (list(cfg.methods), asdict(cfg.edge_pruning)) if cfg.methods else ()
        return (self.kind, list(cfg.receivers), *parts, CIRCUIT_RULE, MIB_RULE, BOOTSTRAP_RULE, *methods)

    def chosen_edges(self) -> list[int]:
        """The edges the table holds: all, or those into the listed receivers."""
        graph = Graph.of(self.session.model)
        if not self.cfg.receivers:
            return list(range(len(graph.edges)))
        names = resolve_receivers(self.cfg.receivers, self.session, f"ablation.scans.{self.name}.receivers")
        return [i for name in names for i in range(len(graph.edges))[graph.edge_slices[graph.receiver(name)]]]

    def sizes(self, n_edges: int) -> list[int]:
        """The curve's sizes: those asked for (None: 1, 2, 4, ..., every edge), and MIB's, which CPR and CMD read."""
        if self.cfg.circuit_sizes is not None:
            asked = set(self.cfg.circuit_sizes)
        else:
            asked = {min(2**i, n_edges) for i in range(n_edges.bit_length() + 1)}
        return sorted(asked | set(mib_sizes(n_edges)))

    def compute(self, key: str) -> ScanResult:
        session, cfg = self.session, self.cfg
        model, graph = session.model, Graph.of(session.model)
        inputs, metric = circuit_inputs(session, self.name)
        budget = inputs.memory_budget

        def estimates(share: ExampleShare) -> dict[str, torch.Tensor]:
            args = (model, share.clean_ids_BT, share.corrupted, share.metric)
            return {
                "eap": eap_scores(*args, share.points_BT, memory_budget=budget, per_example=True),
                "eap_ig": eap_ig_scores(*args, cfg.steps, share.points_BT, memory_budget=budget, per_example=True),
            }

        # per example (B, E): each prompt's own contributions, the scores their sum, the bootstrap's units; each
        # process of a scan over several computes its share of the examples (ablation/records/distributed.py)
        per_example = self.per_example(inputs, metric, estimates)
        eap, eap_ig = per_example["eap"].sum(0), per_example["eap_ig"].sum(0)
        chosen = self.chosen_edges()
        rank = eap[chosen].abs().argsort(descending=True)
        exact_edges = chosen if cfg.exact_all else [chosen[i] for i in rank[: cfg.verify_top_k].tolist()]
        exact = torch.full((len(graph.edges),), float("nan"), dtype=torch.float64)
        per_example["exact"] = torch.full_like(per_example["eap"], float("nan"))
        if exact_edges:

            def exact_scores(share: ExampleShare) -> dict[str, torch.Tensor]:
                args = (model, share.clean_ids_BT, share.corrupted, share.metric, share.points_BT)
                return {"exact": exact_edge_scores(*args, edges=exact_edges, memory_budget=budget, per_example=True)}

            per_example["exact"][:, exact_edges] = self.per_example(inputs, metric, exact_scores)["exact"]
            exact[exact_edges] = per_example["exact"][:, exact_edges].sum(0)
        scores = {"eap": eap, "eap_ig": eap_ig, **({"exact": exact} if not exact.isnan().any() else {})}
        circuit_by = circuit_score(scores)
        pruned = self.learned_masks((model, inputs.clean_ids_BT, inputs.corrupted, metric), inputs, eap_ig)
        if pruned is not None:
            scores["edge_pruning"] = pruned.scores
        if "ensemble" in cfg.methods:
            scores["ensemble"] = ensemble_scores({"eap": eap, "eap_ig": eap_ig, "edge_pruning": pruned.scores})
        size = min(cfg.circuit_size, len(graph.edges))
        circuit = top_edges(graph, scores[circuit_by], size)
        points_P = inputs.points_BT.sum(1)
        counts = resample_counts(len(points_P), RESAMPLES, session.settings.seed)
        intervals = score_intervals({k: v[:, chosen] for k, v in per_example.items()}, points_P, counts, LEVEL)
        stability = top_n_stability(per_example[circuit_by], points_P, counts, size) if size else None
        stable = None if stability is None else {"by": circuit_by, "n": size, "resamples": RESAMPLES}
        if stability is not None:
            stable |= {k: stability[k] for k in ("mean_overlap", "min_overlap")}
        curve, areas, entry = self.circuit_record(graph, circuit, circuit_by, scores, inputs, metric, stable)
        if pruned is not None:
            entry["edge_pruning"] = self.learned_entry(pruned, inputs, metric)
        n = inputs.n_points
        table = pd.DataFrame(
            {
                "edge": [graph.edges[i].name for i in chosen],
                "sender": [graph.edges[i].sender.name for i in chosen],
                "receiver": [graph.edges[i].receiver.name for i in chosen],
                "eap": (eap[chosen] / n).numpy(),
                "eap_ig": (eap_ig[chosen] / n).numpy(),
                "exact": (exact[chosen] / n).numpy(),
            }
        )
        if pruned is not None:
            table["edge_pruning"] = pruned.scores[chosen].numpy()
            table["edge_pruning_log_alpha"] = pruned.log_alpha[chosen].numpy()
            table["edge_pruning_kept"] = pruned.kept[chosen].numpy()
        if "ensemble" in scores:
            table["ensemble"] = scores["ensemble"][chosen].numpy()
        table["rank"] = table["eap"].abs().rank(ascending=False, method="first").astype(int)
        table["verified"] = table["exact"].notna()
        table["in_circuit"] = [i in circuit for i in chosen]
        table["circuit_by"] = circuit_by
        for method, (low, high) in intervals.items():
            table[f"{method}_ci_low"], table[f"{method}_ci_high"] = low.numpy(), high.numpy()
        if stability is not None:
            table["top_share"] = stability["inclusion"][chosen].numpy()
        # The curve, the methods' CPR/CMD and the circuit's entry go through Scan.run with the table: written, hashed,
        # read back as one.
        return ScanResult(table, {FAITHFULNESS: curve, CPR: areas}, {"edge_circuits": {self.name: entry}})

    def learned_masks(self, args: tuple, inputs, eap_ig: torch.Tensor):
        """Edge pruning's trained masks (ablation/methods/edge_pruning.py) on the scan's prompts, warm-started from
        EAP-IG where asked; None unless the scan lists edge_pruning."""
        if "edge_pruning" not in self.cfg.methods:
            return None
        key = f"ablation.scans.{self.name}.edge_pruning"
        warm = eap_ig if self.cfg.edge_pruning.warm_start else None
        budget, world = inputs.memory_budget, self.session.world  # each step's examples shared over its processes
        return edge_pruning(*args, self.cfg.edge_pruning, inputs.points_BT, warm, budget, key, world)

    def learned_entry(self, pruned, inputs, metric) -> dict:
        """summary.json's record of the learned circuit: its edges (P(mask > 0) > 1/2), their faithfulness measured
        exactly, and where training ended (the expected density, its target, the task loss)."""
        kept = set(pruned.kept.nonzero()[:, 0].tolist())
        args = (self.session.model, inputs.clean_ids_BT, inputs.corrupted, [kept], metric, inputs.points_BT)
        last = pruned.history[-1]
        return {
            "kept_edges": len(kept),
            "faithfulness": float(faithfulness(*args, inputs.memory_budget)[0]),
            "target_sparsity": self.cfg.edge_pruning.target_sparsity,
            "expected_density": last["density"],
            "task_loss": last["task_loss"],
            "steps": pruned.steps,
            "examples_per_step": pruned.examples_per_step,
        }

    def circuit_record(
        self,
        graph: Graph,
        circuit: set[int],
        circuit_by: str,
        scores: dict,
        inputs,
        metric,
        stability: dict | None = None,
    ) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
        """The faithfulness curve (the result's second table), the methods' CPR and CMD (its third) and the chosen
        circuit's faithfulness with the top-n's stability over resamples of prompts (its summary.json entry)."""
        session, cfg = self.session, self.cfg
        sizes = self.sizes(len(graph.edges))
        seed = session.settings.seed
        rows, circuits = curve_circuits(graph, scores, sizes, cfg.random_sets, seed)

        def metrics_of(share: ExampleShare) -> dict[str, torch.Tensor]:
            args = (session.model, share.clean_ids_BT, share.corrupted, [*circuits, circuit], share.metric)
            return {"sums": circuit_metrics(*args, share.points_BT, inputs.memory_budget)}

        # the curve's circuits and the drawn one in the same passes: (B, 2 + curve rows + 1) per-prompt sums
        all_BN = self.per_example(inputs, metric, metrics_of)["sums"]
        sums_BN = all_BN[:, :-1]
        curve = curve_table(rows, circuits, sums_BN)
        counts = resample_counts(len(sums_BN), RESAMPLES, seed)
        curve["ci_low"], curve["ci_high"] = (bound.numpy() for bound in faithfulness_intervals(sums_BN, counts, LEVEL))
        areas = mib_areas(mib_points(curve, len(graph.edges)))
        areas = areas.merge(area_intervals(curve, sums_BN, len(graph.edges), counts, LEVEL), on=["method", "draw"])
        value = float(ratios(all_BN[:, [0, 1, -1]].sum(0))[0])
        entry = {
            "circuit_size": cfg.circuit_size,
            "circuit_by": circuit_by,
            "circuit_edges": len(circuit),
            "circuit_faithfulness": value,
            "mib": method_areas(areas),
            **({"stability": stability} if stability is not None else {}),
        }
        return curve, areas, entry

    @property
    def curve_csv(self) -> Path:
        return self.path(".csv", FAITHFULNESS)

    def typed_table(self, table: pd.DataFrame) -> pd.DataFrame:
        return table.assign(
            exact=pd.to_numeric(table["exact"], errors="coerce"),
            exact_ci_low=pd.to_numeric(table["exact_ci_low"], errors="coerce"),
            exact_ci_high=pd.to_numeric(table["exact_ci_high"], errors="coerce"),
            verified=table["verified"].astype(str) == "True",
            in_circuit=table["in_circuit"].astype(str) == "True",
            **(
                {"edge_pruning_kept": table["edge_pruning_kept"].astype(str) == "True"}
                if "edge_pruning_kept" in table
                else {}
            ),
        )

    def use(self, table: pd.DataFrame) -> None:
        entry: dict = {"n_edges": len(table), "verified": int(table["verified"].sum())}
        entry.update(agreement_entry(table, self.cfg.verify_top_k))
        largest = table.loc[table["exact"].abs().idxmax()] if table["verified"].any() else None
        if largest is not None:
            entry["largest_exact"] = {
                "edge": largest["edge"],
                "exact": float(largest["exact"]),
                "ci_low": float(largest["exact_ci_low"]),
                "ci_high": float(largest["exact_ci_high"]),
            }
        self.session.files.update_summary({"edge_attribution": {self.name: entry}})

    def figures(self, table: pd.DataFrame) -> list[Path | None]:
        metric, graph = self.session.metric, Graph.of(self.session.model)
        curve = pd.read_csv(self.curve_csv)  # as Scan.run wrote them, not state kept from compute()
        entry = self.session.files.section_value("edge_circuits")[self.name]
        curve_png = faithfulness_figure(
            curve, self.path(".png", "_faithfulness"), self.title("faithfulness against n"), entry
        )
        weights = torch.zeros(len(graph.edges), dtype=torch.float64)
        score = str(table["circuit_by"].iloc[0])
        index = [graph.edge_index[e] for e in table["edge"]]
        # signed as damage (positive: removing the edge makes the metric worse), so the figure dashes the edges whose
        # removal helps
        weights[index] = metric.damage(torch.tensor(table[score].to_numpy(), dtype=torch.float64), 0.0)
        circuit = {graph.edge_index[e] for e in table.loc[table["in_circuit"].astype(str) == "True", "edge"]}
        shown = "" if len(table) == len(graph.edges) else f"; drawn: those into {', '.join(self.cfg.receivers)}"
        title = self.title(
            f"circuit of {entry['circuit_edges']} edges by |{score}| ({metric.unit}), faithfulness "
            f"{entry['circuit_faithfulness']:.2f}{shown}"
        )
        circuit_png = self.path(".png", "_circuit")
        atomic_savefig(draw_circuit(graph, circuit, weights, title), circuit_png, dpi=120)
        return [curve_png, circuit_png, self.interval_figure(table, score, entry.get("stability"))]

    def interval_figure(self, table: pd.DataFrame, score: str, stability: dict | None) -> Path:
        """The 20 edges of largest |score| (the circuit's) with their bootstrap intervals, titled with how stable
        the circuit's top edges are over the resamples."""
        how = (
            ""
            if stability is None
            else (
                f"; its top {stability['n']} keep on average {stability['mean_overlap']:.0%} of their places over "
                f"{stability['resamples']} resamples (lowest {stability['min_overlap']:.0%})"
            )
        )
        title = self.title(f"the edges of largest |{score}|, with their intervals{how}")
        label = f"{score} ({self.session.metric.unit} per score point)"
        return interval_figure(table.assign(mask=table["edge"]), self.path(".png", "_intervals"), title, label, score)


def agreement_entry(table: pd.DataFrame, k: int) -> dict:
    """How EAP's and EAP-IG's rankings agree with the exact scores (summary.json's `eap` and `eap_ig`): Spearman's
    rank correlation when every edge of the table has an exact score, and the top-k recall where k is below the
    number of edges; where a number is not reported, the entry says why in its place (a recall over every edge is
    1.0 whatever the scores; with only some edges exact there is no ranking of all to compare)."""
    n, recall = len(table), f"top_{k}_recall"
    if not table["verified"].all():
        why = (
            f"not reported: {int(table['verified'].sum())} of the {n} edges have an exact score (exact_all scores all)"
        )
        return {method: why for method in ("eap", "eap_ig")}
    if n < 2:
        return {method: f"not reported: a ranking of {n} edge compares nothing" for method in ("eap", "eap_ig")}
    exact = torch.tensor(table["exact"].to_numpy())
    entry = {}
    for method in ("eap", "eap_ig"):
        agreement = ranking_agreement(torch.tensor(table[method].to_numpy()), exact, min(max(k, 1), n))
        entry[method] = {"spearman": agreement["spearman"]}
        if 1 <= k < n:
            entry[method][recall] = agreement["top_k_recall"]
        else:
            entry[method][recall] = (
                f"not reported: verify_top_k={k} is not below the {n} edges, so the recall is 1.0 whatever the scores"
                if k >= 1
                else "not reported: verify_top_k=0 names no top k"
            )
    return entry


def circuit_score(scores: dict[str, torch.Tensor]) -> str:
    """The score the drawn circuit is chosen by: exact where every edge has an exact score, else EAP-IG. Exact scores
    of some edges only are not mixed in: an edge's |exact| and another's |EAP-IG| are not on one scale (EAP-IG misses
    exact scores by more than their size where zeroing an edge is far from the first-order regime), and an order
    that puts the exact-scored edges first keeps edges into unscored receivers out of every small circuit, which
    pruning then empties (docs/DESIGN.md, "Circuits")."""
    return "exact" if "exact" in scores else "eap_ig"


def faithfulness_figure(curve: pd.DataFrame, path: Path, title: str, circuit: dict | None = None) -> Path:
    """Faithfulness against the circuit's size n, a line per method (labelled with its CPR and CMD where the summary
    entry has them, `mib`); random sets as their mean and range; the drawn circuit (its summary entry: circuit_size,
    circuit_by, circuit_faithfulness) as a star."""
    fig = new_figure(6, 4)
    ax = fig.add_subplot()
    for method, rows in curve.groupby("method", sort=False):
        stats = rows.groupby("n")["faithfulness"].agg(["mean", "min", "max"])
        colour = METHOD_COLOURS.get(str(method))
        areas = (circuit or {}).get("mib", {}).get(str(method))
        label = str(method) if areas is None else f"{method} (CPR {areas['cpr']:.3f}, CMD {areas['cmd']:.3f})"
        ax.plot(stats.index, stats["mean"], marker="o", markersize=3, color=colour, label=label)
        if method == "random":
            ax.fill_between(stats.index, stats["min"], stats["max"], color=colour, alpha=0.2)
        elif "ci_low" in rows:  # the bootstrap interval over prompts of each circuit's faithfulness
            bounds = rows.groupby("n")[["ci_low", "ci_high"]].first()
            errors = [stats["mean"] - bounds["ci_low"], bounds["ci_high"] - stats["mean"]]
            ax.errorbar(stats.index, stats["mean"], yerr=errors, fmt="none", ecolor=colour, capsize=2, linewidth=0.8)
    if circuit is not None:
        label = f"drawn circuit (by {circuit['circuit_by']})"
        colour = METHOD_COLOURS.get(circuit["circuit_by"])
        ax.plot([circuit["circuit_size"]], [circuit["circuit_faithfulness"]], "*", ms=12, color=colour, label=label)
    ax.axhline(1.0, color="black", linewidth=0.6, linestyle="--")
    ax.set_xscale("symlog", linthresh=1)
    sizes = sorted(int(n) for n in curve["n"].unique())
    ax.set_xticks(sizes, [str(n) for n in sizes])  # the sizes measured, not the log scale's decades
    ax.minorticks_off()
    ax.set(xlabel="edges kept (n, before pruning)", ylabel="faithfulness")
    ax.legend(fontsize=8)
    set_title(ax, title)
    atomic_savefig(fig, path, dpi=120)
    return Path(path)
