"""`single_head`: each head off alone. Its loss deltas rank the heads for `pairs` with top_k and for the single_head
pruning order, and its largest one goes to summary.json as the most important head."""

from pathlib import Path

import pandas as pd
from torch import Tensor

from headcount.ablation.masks import HeadMask, single_head_masks
from headcount.ablation.scans.base import register
from headcount.ablation.scans.mask_scan import FIGURE_LABEL, FIGURE_VALUE, MaskScan, figure_title
from headcount.plotting import head_heatmap


@register
class SingleHeadScan(MaskScan):
    kind = "single_head"

    def masks(self) -> list[HeadMask]:
        return single_head_masks(self.session.heads_per_layer)

    @classmethod
    def figure(cls, table: pd.DataFrame, path: Path, subject: str = "") -> Path:
        return head_heatmap(table, path, FIGURE_VALUE, figure_title(table, subject), FIGURE_LABEL)

    def use(self, table: pd.DataFrame) -> None:
        self.session.shared[self.kind] = self.session.layer_head_tensor(table, "delta_loss")
        top = table.loc[table["delta_loss"].idxmax()]
        most_important = {
            "mask": top["mask"],
            "layer": int(top["layer"]),
            "head": int(top["head"]),
            "delta_loss": float(top["delta_loss"]),
        }
        self.session.files.update_summary({"most_important_head": most_important})


def single_head_delta(session, compute: bool = True) -> Tensor | None:
    """(L, H) loss increase of each head off alone, from this session's single_head scan or an up-to-date
    single_head.csv; failing both, runs the scan, or with compute=False returns None."""
    return session.provided(SingleHeadScan.kind, compute)
