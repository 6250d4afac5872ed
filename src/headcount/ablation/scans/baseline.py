"""`baseline`: the unmasked model alone, loss and accuracy on ablation.split; one number, so no figure."""

from headcount.ablation.engine.masks import HeadMask, baseline_masks
from headcount.ablation.scans.base import KINDS
from headcount.ablation.scans.mask_scan import MaskScan


@KINDS.register
class BaselineScan(MaskScan):
    kind = "baseline"
    doc = "the unmasked model"

    def masks(self) -> list[HeadMask]:
        return baseline_masks()
