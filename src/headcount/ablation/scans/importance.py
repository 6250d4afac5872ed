"""`importance`: gradient head importance of the metric (Michel et al.), from the attribution pass
(ablation/methods/attribution.py): `grad_importance` as the pruning orders rank it (normalised per layer with
ablation.normalize_importance, except in layers of one head), `grad_importance_raw` (E_batches |dL/dg|, in the
metric's unit per unit of gate), and the paper's own form, the expectation over examples, as
`grad_importance_per_example` (normalised likewise) and `grad_importance_per_example_raw`, the last with its 95%
bootstrap interval over the prompts (`_ci_low`, `_ci_high`: the mean over prompts of |A_p| / n_p resampled, 1000
resamples seeded by ablation.seed, intervals.py) and top_share (summary.json's `intervals` entry); with each head's
single-head delta beside them when the single_head scan has run or is up to date. The per-batch forms are means over
batches, not over prompts: they have no interval."""

from pathlib import Path

import pandas as pd
import torch

from headcount.ablation.engine.heads import all_heads
from headcount.ablation.engine.metrics import require_differentiable
from headcount.ablation.methods.importance import normalize_per_layer
from headcount.ablation.methods.seq2seq_attribution import attribute_heads
from headcount.ablation.scans.base import KINDS, Scan, ScanResult, ScanSettings
from headcount.ablation.scans.by_kind import kind_panels, with_kinds
from headcount.ablation.scans.intervals import BOOTSTRAP_RULE, score_intervals
from headcount.ablation.scans.single_head import single_head_delta
from headcount.config.ablation import AblationConfig
from headcount.plotting import head_heatmap


@KINDS.register
class ImportanceScan(Scan):
    kind = "importance"
    ranks_heads = True
    doc = "gradient importance E|dL/dg| (Michel et al.), per batch and per example"
    reads = Scan.reads | {"model", "batches", "replacements", "layer_head_tensor"}

    @classmethod
    def check(cls, name: str, cfg: ScanSettings, settings: AblationConfig) -> None:
        require_differentiable(settings.metric, f"the {name} scan (gradient importance)")

    def fingerprint_parts(self) -> tuple:
        return (self.kind, self.session.settings.normalize_importance, BOOTSTRAP_RULE)

    def optional_needs(self) -> list[str]:
        return ["single_head"]  # the single_head_delta column, where single_head ran first or is up to date

    def compute(self, key: str) -> ScanResult:
        session, hpl = self.session, self.session.model.heads_per_layer
        attribution = attribute_heads(session.model, session.batches, session.replacements, session.metric)
        normalize = session.settings.normalize_importance
        scored = lambda raw: normalize_per_layer(raw, hpl) if normalize else raw  # noqa: E731
        layers, heads = (list(x) for x in zip(*all_heads(hpl)))
        forms = {
            "grad_importance": scored(attribution.batch_abs_LH),
            "grad_importance_raw": attribution.batch_abs_LH,
            "grad_importance_per_example": scored(attribution.example_abs_LH),
            "grad_importance_per_example_raw": attribution.example_abs_LH,
        }
        table = pd.DataFrame(
            {"layer": layers, "head": heads, **{k: v[layers, heads].numpy() for k, v in forms.items()}}
        )
        # the paper's form is a mean over prompts of |A_p| / n_p: resampled as prompts of one point each
        scored_E = attribution.points_E > 0
        per_prompt_EK = attribution.example_ELH[scored_E][:, layers, heads].abs() / attribution.points_E[scored_E, None]
        ones_E = torch.ones(len(per_prompt_EK), dtype=torch.float64)
        column = "grad_importance_per_example_raw"
        intervals, entry = score_intervals(per_prompt_EK, ones_E, column, session.settings.seed)
        table = table.assign(**intervals)
        delta_LH = single_head_delta(session, compute=False)
        if delta_LH is not None:
            table["single_head_delta"] = delta_LH[layers, heads].numpy()
        # an encoder-decoder's grid rows as each head's kind and layer
        return ScanResult(with_kinds(table, hpl), summary={"intervals": {self.name: entry}})

    def use(self, table: pd.DataFrame) -> None:
        self.session.hand(self.kind, self.session.layer_head_tensor(table, "grad_importance_raw"))

    def figures(self, table: pd.DataFrame) -> list[Path | None]:
        metric = self.session.metric
        if self.session.settings.normalize_importance:
            what, unit = "gradient importance, l2-normalised per layer", "E|dL/dg| / layer norm (unitless)"
        else:
            what, unit = "gradient importance E|dL/dg|", f"E|dL/dg| ({metric.unit} per unit of gate)"
        if metric.named_in_results:
            what = f"{what} of {metric.name}"
        if "kind" in table:  # an encoder-decoder's: a panel per kind of head
            return [kind_panels(table, self.path(".png"), "grad_importance", self.title(what), unit)]
        return [head_heatmap(table, self.path(".png"), "grad_importance", self.title(what), unit)]
