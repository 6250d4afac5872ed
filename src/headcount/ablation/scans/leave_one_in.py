"""`leave_one_in`: Michel et al.'s "all but one": in one layer only one head stays on."""

from pathlib import Path

import pandas as pd

from headcount.ablation.engine.masks import HeadMask, leave_one_in_masks
from headcount.ablation.scans.base import KINDS
from headcount.ablation.scans.mask_scan import MaskScan, head_figure


@KINDS.register
class LeaveOneInScan(MaskScan):
    kind = "leave_one_in"
    doc = "in one layer only one head stays on (Michel et al.'s all but one)"
    reads = MaskScan.reads | {"model"}

    def masks(self) -> list[HeadMask]:
        return leave_one_in_masks(self.session.model.heads_per_layer)

    @classmethod
    def figure(cls, table: pd.DataFrame, path: Path, subject: str = "") -> Path:
        return head_figure(table, path, subject)
