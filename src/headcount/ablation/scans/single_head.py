"""`single_head`: each head off alone (with ablation.patch_positions=each, each head at each named position of the
task alone). How much each head's removal worsens the metric (its damage: the loss increase, the logit difference's
decrease, ...; per head the largest over positions) ranks the heads for `pairs` with top_k and for the single_head
pruning order, and the largest goes to summary.json as the most important head."""

from pathlib import Path

import pandas as pd
from torch import Tensor

from headcount.ablation.engine.masks import HeadMask, single_head_masks
from headcount.ablation.scans.base import KINDS
from headcount.ablation.scans.mask_scan import MaskScan, head_figure


@KINDS.register
class SingleHeadScan(MaskScan):
    kind = "single_head"
    ranks_heads = True
    doc = "each head off alone (or each head at each named position of a task)"
    reads = MaskScan.reads | {"model", "layer_head_tensor"}

    def masks(self) -> list[HeadMask]:
        positions = self.session.positions if self.session.settings.patch_positions == "each" else None
        return single_head_masks(self.session.model.heads_per_layer, positions)

    @classmethod
    def figure(cls, table: pd.DataFrame, path: Path, subject: str = "") -> Path:
        return head_figure(table, path, subject)

    def use(self, table: pd.DataFrame) -> None:
        metric = self.session.metric
        delta = f"delta_{metric.primary}"
        damage = table.assign(damage=metric.damage(table[delta], 0.0))
        head = ["kind", "layer", "head"] if "kind" in table else ["layer", "head"]  # an encoder-decoder's by kind
        per_head = damage.loc[damage.groupby(head)["damage"].idxmax()]
        self.session.hand(self.kind, self.session.layer_head_tensor(per_head, "damage"))
        top = damage.loc[damage["damage"].idxmax()]
        most_important = {
            "mask": top["mask"],
            **({"kind": top["kind"]} if "kind" in table else {}),
            "layer": int(top["layer"]),
            "head": int(top["head"]),
            delta: float(top[delta]),
        }
        self.session.files.update_summary({"most_important_head": most_important})


def single_head_delta(session, compute: bool = True) -> Tensor | None:
    """(L, H) how much each head off alone worsens the metric (for loss: its increase), from the single_head scan the
    caller declared it needs (run first by the session); with compute=False (an optional read): this session's run,
    else an up-to-date single_head.csv, else None."""
    return session.provided(SingleHeadScan.kind, compute)
