"""`attribution`: every head's effect on the metric estimated at once by attribution patching
(ablation/methods/attribution.py: one forward and one backward pass per batch, in the session's mode and metric; per
head and named position with ablation.patch_positions=each), then the `verify_top_k` largest estimates evaluated exactly
by the evaluator.

On an encoder-decoder every head of its grid of three kinds, from the gradient at its gates (seq2seq_attribution.py),
with a `kind` column before `layer` (the kind's own layer).

Columns: layer, head, [position], attribution (the estimated change of the metric, in its unit), attribution_ci_low
and _ci_high (the estimate's 95% bootstrap interval over the prompts, 1000 resamples seeded by ablation.seed:
intervals.py), top_share (the share of resamples with the head among the top 5% by |attribution|; summary.json's
`intervals` entry says how stable that top is), rank (by |attribution|, 1 first), exact (the exact change of the
verified heads), verified; the figure draws each estimate's interval. When an exact single_head scan of
the same mode and metric is up to date in the run (run it first), the table handed back, the figure and the summary
read every head's exact change from it, and summary.json's `attribution` entry reports Spearman's rank correlation of
the estimates with the exact changes and the recall of the exact top-k (by |change|) within the estimate's top-k and
top-2k.
"""

from pathlib import Path

import numpy as np
import pandas as pd

from headcount.ablation.engine.masks import single_head_masks
from headcount.ablation.engine.metrics import require_differentiable
from headcount.ablation.methods.attribution import attribute
from headcount.ablation.methods.seq2seq_attribution import attribute_heads
from headcount.ablation.scans.base import KINDS, Scan, ScanResult
from headcount.ablation.scans.by_kind import with_kinds
from headcount.ablation.scans.intervals import BOOTSTRAP_RULE, score_intervals
from headcount.config.ablation import AblationConfig
from headcount.config.scans import AttributionSettings
from headcount.errors import ConfigError
from headcount.io import atomic_savefig
from headcount.plotting import new_figure, set_title


@KINDS.register
class AttributionScan(Scan):
    kind = "attribution"
    ranks_heads = True
    doc = "every head's effect estimated at once (attribution patching), the top k verified exactly"
    reads = Scan.reads | {"model", "batches", "replacements", "positions", "baseline", "evaluator", "layer_head_tensor"}
    Settings = AttributionSettings

    @classmethod
    def check(cls, name: str, cfg: AttributionSettings, settings: AblationConfig) -> None:
        require_differentiable(settings.metric, f"the {name} scan (attribution patching)")
        if cfg.verify_top_k < 0:
            raise ConfigError(f"ablation.scans.{name}.verify_top_k", cfg.verify_top_k, "must be 0 or more")

    def fingerprint_parts(self) -> tuple:
        return (self.kind, self.cfg.verify_top_k, str(self.session.settings.patch_positions), BOOTSTRAP_RULE)

    def per_position(self) -> bool:
        return self.session.settings.patch_positions == "each"

    def compute(self, key: str) -> ScanResult:
        session = self.session
        hpl = session.model.heads_per_layer
        masks = single_head_masks(hpl, session.positions if self.per_position() else None)
        if self.per_position():
            attribution = attribute(
                session.model, session.batches, session.replacements, session.metric, per_position=True
            )
        else:  # an encoder-decoder's over its grid of three kinds (seq2seq_attribution.py)
            attribution = attribute_heads(session.model, session.batches, session.replacements, session.metric)
        # each mask's grid row and head (on an encoder-decoder its `layer` is the kind's own)
        layers, heads = [m.heads_off[0][0] for m in masks], [m.heads_off[0][1] for m in masks]
        if self.per_position():
            at = [session.positions.index(m.position) for m in masks]
            estimate = [float(attribution.estimate_KLH[k, layer, head]) for k, layer, head in zip(at, layers, heads)]
            examples_EM = attribution.example_EKLH[:, at, layers, heads]
        else:
            estimate = [float(attribution.estimate_LH[layer, head]) for layer, head in zip(layers, heads)]
            examples_EM = attribution.example_ELH[:, layers, heads]
        table = with_kinds(pd.DataFrame({"mask": [m.name for m in masks], "layer": layers, "head": heads}), hpl)
        if self.per_position():
            table["position"] = [m.position for m in masks]
        table["attribution"] = estimate
        intervals, entry = score_intervals(examples_EM, attribution.points_E, "attribution", session.settings.seed)
        table = table.assign(**intervals)
        table["rank"] = table["attribution"].abs().rank(ascending=False, method="first").astype(int)
        verified = [m for m, rank in zip(masks, table["rank"]) if rank <= self.cfg.verify_top_k]
        exact = {}
        if verified:
            totals = self.evaluate(verified, key)
            primary = session.metric.primary
            deltas = (totals.value(primary) - session.baseline[primary]).tolist()
            exact = dict(zip([m.name for m in verified], deltas))
        table["exact"] = table["mask"].map(exact).astype(float)
        table["verified"] = table["rank"] <= self.cfg.verify_top_k
        return ScanResult(table, summary={"intervals": {self.name: entry}})

    def optional_needs(self) -> list[str]:
        return ["single_head"]  # every head's exact change, where an up-to-date single_head result is there

    def exact_scan(self) -> pd.Series | None:
        """mask -> exact delta of the metric from an up-to-date single_head scan of this mode and metric (with the
        same positions), or None."""
        from headcount.ablation.scans.single_head import SingleHeadScan  # a sibling kind, read back only

        session = self.session
        table = SingleHeadScan("single_head", None, session).read_back(announce=False)
        if table is None:
            return None
        return table.set_index("mask")[f"delta_{session.metric.primary}"]

    def typed_table(self, table: pd.DataFrame) -> pd.DataFrame:
        exact = pd.to_numeric(table["exact"], errors="coerce")  # read back, an empty cell is ""
        return table.assign(exact=exact, verified=table["verified"].astype(str) == "True")

    def handed_back(self, table: pd.DataFrame) -> pd.DataFrame:
        """Every head's exact change, from the single_head scan of this mode and metric when it is up to date."""
        scan_exact = self.exact_scan()
        if scan_exact is None:
            return table
        return table.assign(exact=table["exact"].fillna(table["mask"].map(scan_exact)))

    def use(self, table: pd.DataFrame) -> None:
        table = self.handed_back(table)  # the summary reads every exact change there is
        if "position" not in table:  # per head: how much switching it off is estimated to worsen the metric
            damage = table.assign(damage=self.session.metric.damage(table["attribution"], 0.0))
            self.session.hand(self.kind, self.session.layer_head_tensor(damage, "damage"))
        summary = attribution_summary(table, self.cfg.verify_top_k)
        self.session.files.update_summary({"attribution": {self.name: summary}})

    def figures(self, table: pd.DataFrame) -> list[Path | None]:
        table = self.handed_back(table)
        metric = self.session.metric
        title = self.title(f"attribution estimate against exact change in {metric.name} ({metric.unit})")
        return [attribution_figure(table, self.path(".png"), title, metric.unit)]


def attribution_summary(table: pd.DataFrame, k: int) -> dict:
    """How the estimates compare with the exact changes: of the verified heads always, of every head when all have
    an exact change (Spearman's rho, recall of the exact top-k within the estimate's top-k and top-2k). A recall is
    reported only where its k (or 2k) is fewer than the heads: with k heads or more it is 1.0 whatever the estimates
    (the default verify_top_k of 10 on an 8-head model), so it says nothing."""
    verified = table[table["verified"]]
    summary = {
        "verify_top_k": k,
        "n_heads": len(table),
        "max_abs_error_verified": float((verified["attribution"] - verified["exact"]).abs().max())
        if len(verified)
        else None,
    }
    k = min(k, len(table))
    if table["exact"].notna().all() and len(table) > 1 and k > 0:
        exact_rank = table["exact"].abs().rank(ascending=False, method="first")
        top_exact = set(table.index[exact_rank <= k])
        summary.update(
            spearman=float(table["attribution"].rank().corr(table["exact"].rank())),
            spearman_abs=float(table["attribution"].abs().rank().corr(table["exact"].abs().rank())),
        )
        for name, within in (("recall_top_k", k), ("recall_top_k_in_2k", 2 * k)):
            if within < len(table):
                summary[name] = len(top_exact & set(table.index[table["rank"] <= within])) / k
    return summary


def attribution_figure(table: pd.DataFrame, path: Path, title: str, unit: str) -> Path:
    """Estimate (x) against exact change (y), one point per head (or head and position) with an exact value, the
    verified ones marked; the diagonal is where the estimate is exact."""
    fig = new_figure(6, 5)
    ax = fig.add_subplot()
    known = table[table["exact"].notna()]
    others = known[~known["verified"]]
    ax.scatter(
        others["attribution"], others["exact"], s=10, color="tab:gray", alpha=0.6, label="exact from single_head"
    )
    if "attribution_ci_low" in known:  # each estimate's bootstrap interval, drawn across the estimate's axis
        low, high = known["attribution_ci_low"].to_numpy(float), known["attribution_ci_high"].to_numpy(float)
        ax.hlines(known["exact"], low, high, color="tab:gray", linewidth=0.7, label="95% bootstrap interval")
    top = known[known["verified"]]
    ax.scatter(top["attribution"], top["exact"], s=22, color="tab:red", label=f"verified (top {len(top)})")
    for row in top.itertuples():
        ax.annotate(row.mask, (row.attribution, row.exact), fontsize=7, xytext=(3, 3), textcoords="offset points")
    values = np.concatenate([known["attribution"].to_numpy(float), known["exact"].to_numpy(float)])
    if len(values):
        low, high = float(values.min()), float(values.max())
        ax.plot([low, high], [low, high], color="black", linewidth=0.8, linestyle="--", label="estimate = exact")
    ax.set(xlabel=f"attribution estimate ({unit})", ylabel=f"exact change ({unit})")
    set_title(ax, title)
    ax.legend(fontsize=8)
    atomic_savefig(fig, path, dpi=120)
    return Path(path)
