"""`pairs`: two heads off together: every pair, or with top_k=k the pairs among the k heads whose single-head
ablation raised the loss most (the single_head scan runs first if it has not). Its figure is a heads x heads grid.
On an encoder-decoder the heads are its grid's, of every kind, and a pair's name says each head's kind
(enc.L0H1+cross.L1H0)."""

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
from headcount.labels import HEAD_KINDS, parse_kind_head, split_mask
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
        hpl = self.session.model.heads_per_layer  # an encoder-decoder's grid names its heads by kind (cross.L1H0)
        if self.cfg.top_k is None:
            return pair_masks(all_heads(hpl), hpl)
        return pair_masks(most_important_heads(single_head_delta(self.session), hpl, self.cfg.top_k), hpl)

    @classmethod
    def figure(cls, table: pd.DataFrame, path: Path, subject: str = "") -> Path:
        """Heads x heads, symmetric: the cell of (a, b) is the pair's value; heads in the model's order (an
        encoder-decoder's by kind: enc, dec, cross)."""
        pairs = [tuple(split_mask(name)) for name in table["mask"]]
        labels = sorted({label for pair in pairs for label in pair}, key=head_order)
        index = {label: i for i, label in enumerate(labels)}
        grid = np.full((len(labels), len(labels)), np.nan)
        for (a, b), v in zip(pairs, table[table_metric(table)[0]].to_numpy(float)):
            grid[index[a], index[b]] = grid[index[b], index[a]] = v
        return heatmap(grid, path, figure_title(table, subject), labels, labels, "head", "head", table_metric(table)[1])


def head_order(label: str) -> tuple[int, int, int]:
    """A head label's place: a one-stack model's by (layer, head), an encoder-decoder's kinds in order first."""
    kind, layer, head = parse_kind_head(label)
    return (0 if kind is None else HEAD_KINDS.index(kind) + 1, layer, head)
