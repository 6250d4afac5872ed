"""`importance`: gradient head importance (Michel et al.), with each head's single-head loss delta beside it when the
single_head scan has run or is up to date."""

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
        importance_LH = self.session.importance(torch.ones(model.n_layers, model.max_heads)).cpu()
        layers, heads = (list(x) for x in zip(*all_heads(self.session.heads_per_layer)))
        table = pd.DataFrame({"layer": layers, "head": heads, "grad_importance": importance_LH[layers, heads].numpy()})
        delta_LH = single_head_delta(self.session, compute=False)
        if delta_LH is not None:
            table["single_head_delta"] = delta_LH[layers, heads].numpy()
        return table

    def figures(self, table: pd.DataFrame) -> list[Path | None]:
        s = self.session.settings
        normalized = " (l2 per layer)" if s.normalize_importance else ""
        title = f"{self.name}: gradient importance{normalized}, {s.mode} ablation"
        return [head_heatmap(table, self.session.out / f"{self.name}.png", "grad_importance", title)]
