"""`importance`: gradient head importance (Michel et al.): `grad_importance` as the pruning orders rank it (normalised
per layer with ablation.normalize_importance, except in layers of one head) and `grad_importance_raw` (E|dL/dg|, in
nats per unit of gate), with each head's single-head loss delta beside them when the single_head scan has run or is
up to date."""

from pathlib import Path

import pandas as pd
import torch

from headcount.ablation.masks import all_heads
from headcount.ablation.scans.base import Scan, register
from headcount.ablation.scans.single_head import single_head_delta
from headcount.plotting import head_heatmap


@register
class ImportanceScan(Scan):
    kind = "importance"

    def fingerprint_parts(self) -> tuple:
        return (self.kind, self.session.settings.normalize_importance)

    def compute(self, key: str) -> pd.DataFrame:
        model = self.session.model
        importance = self.session.importance(torch.ones(model.n_layers, model.max_heads))
        score_LH, raw_LH = importance.score_LH.cpu(), importance.raw_LH.cpu()
        layers, heads = (list(x) for x in zip(*all_heads(self.session.heads_per_layer)))
        table = pd.DataFrame(
            {
                "layer": layers,
                "head": heads,
                "grad_importance": score_LH[layers, heads].numpy(),
                "grad_importance_raw": raw_LH[layers, heads].numpy(),
            }
        )
        delta_LH = single_head_delta(self.session, compute=False)
        if delta_LH is not None:
            table["single_head_delta"] = delta_LH[layers, heads].numpy()
        return table

    def figures(self, table: pd.DataFrame) -> list[Path | None]:
        if self.session.settings.normalize_importance:
            what, unit = "gradient importance, l2-normalised per layer", "E|dL/dg| / layer norm (unitless)"
        else:
            what, unit = "gradient importance E|dL/dg|", "E|dL/dg| (nats per unit of gate)"
        return [head_heatmap(table, self.path(".png"), "grad_importance", self.title(what), unit)]
