"""`pairs`: two heads off together: every pair, or with top_k=k the pairs among the k heads whose single-head
ablation raised the loss most (the single_head scan runs first if it has not). Its figure is a heads x heads grid."""

from pathlib import Path

import numpy as np
import pandas as pd

from headcount.ablation.engine.heads import all_heads
from headcount.ablation.engine.masks import HeadMask, most_important_heads, pair_masks
from headcount.ablation.scans.base import KINDS
from headcount.ablation.scans.mask_scan import MaskScan, figure_title, table_metric
from headcount.ablation.scans.single_head import SingleHeadScan, single_head_delta
from headcount.config.ablation import AblationConfig
from headcount.config.scans import PairsSettings
from headcount.errors import ConfigError
from headcount.labels import head_label, heads_in
from headcount.plotting import heatmap


@KINDS.register
class PairsScan(MaskScan):
    kind = "pairs"
    doc = "two heads off together: all pairs, or pairs among the top k"
    reads = MaskScan.reads | {"model"}
    Settings = PairsSettings

    @classmethod
    def check(cls, name: str, cfg: PairsSettings, settings: AblationConfig) -> None:
        if cfg.top_k is not None and cfg.top_k < 2:
            raise ConfigError(
                f"ablation.scans.{name}.top_k", cfg.top_k, "must be at least 2 (pairs among the top k heads) or null"
            )

    def needs(self) -> list[str]:
        return [] if self.cfg.top_k is None else [SingleHeadScan.kind]

    def masks(self) -> list[HeadMask]:
        hpl = self.session.model.heads_per_layer
        if self.cfg.top_k is None:
            return pair_masks(all_heads(hpl))
        return pair_masks(most_important_heads(single_head_delta(self.session), hpl, self.cfg.top_k))

    @classmethod
    def figure(cls, table: pd.DataFrame, path: Path, subject: str = "") -> Path:
        """Heads x heads, symmetric: the cell of (a, b) is the pair's value."""
        pairs = [tuple(heads_in(name)) for name in table["mask"]]
        heads = sorted({head for pair in pairs for head in pair})
        index = {head: i for i, head in enumerate(heads)}
        grid = np.full((len(heads), len(heads)), np.nan)
        for (a, b), v in zip(pairs, table[table_metric(table)[0]].to_numpy(float)):
            grid[index[a], index[b]] = grid[index[b], index[a]] = v
        labels = [head_label(layer, head) for layer, head in heads]
        return heatmap(grid, path, figure_title(table, subject), labels, labels, "head", "head", table_metric(table)[1])
