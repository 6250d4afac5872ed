"""`importance`: gradient head importance of the metric (Michel et al.), from the attribution pass
(ablation/methods/attribution.py): `grad_importance` as the pruning orders rank it (normalised per layer with
ablation.normalize_importance, except in layers of one head), `grad_importance_raw` (E_batches |dL/dg|, in the
metric's unit per unit of gate), and the paper's own form, the expectation over examples, as
`grad_importance_per_example` (normalised likewise) and `grad_importance_per_example_raw`; with each head's
single-head delta beside them when the single_head scan has run or is up to date."""

from pathlib import Path

import pandas as pd

from headcount.ablation.engine.heads import all_heads
from headcount.ablation.engine.metrics import require_differentiable
from headcount.ablation.methods.importance import normalize_per_layer
from headcount.ablation.methods.seq2seq_attribution import attribute_heads
from headcount.ablation.scans.base import KINDS, Scan, ScanSettings
from headcount.ablation.scans.by_kind import kind_panels, with_kinds
from headcount.ablation.scans.single_head import single_head_delta
from headcount.config.ablation import AblationConfig
from headcount.plotting import head_heatmap


@KINDS.register
class ImportanceScan(Scan):
    kind = "importance"
    ranks_heads = True
    doc = "gradient importance E|dL/dg| (Michel et al.), per batch and per example"

    @classmethod
    def check(cls, name: str, cfg: ScanSettings, settings: AblationConfig) -> None:
        require_differentiable(settings.metric, f"the {name} scan (gradient importance)")

    def fingerprint_parts(self) -> tuple:
        return (self.kind, self.session.settings.normalize_importance)

    def compute(self, key: str) -> pd.DataFrame:
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
        delta_LH = single_head_delta(session, compute=False)
        if delta_LH is not None:
            table["single_head_delta"] = delta_LH[layers, heads].numpy()
        return with_kinds(table, hpl)  # an encoder-decoder's grid rows as each head's kind and layer

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
