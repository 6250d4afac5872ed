"""`custom`: masks from a YAML/JSON file (masks.py), read and checked against the model before any work; its figure
is one bar per mask."""

from pathlib import Path

import numpy as np
import pandas as pd

from headcount.ablation.engine.masks import HeadMask, load_custom_masks
from headcount.ablation.scans.base import KINDS
from headcount.ablation.scans.mask_scan import MaskScan, figure_title, table_metric
from headcount.config.ablation import AblationConfig
from headcount.config.scans import CustomSettings
from headcount.errors import ConfigError
from headcount.io import atomic_savefig
from headcount.plotting import new_figure, set_title


@KINDS.register
class CustomScan(MaskScan):
    kind = "custom"
    doc = "your masks, from a YAML or JSON file"
    reads = MaskScan.reads | {"model"}
    Settings = CustomSettings

    @classmethod
    def check(cls, name: str, cfg: CustomSettings, settings: AblationConfig) -> None:
        if not cfg.masks_file:
            raise ConfigError(
                f"ablation.scans.{name}.masks_file", cfg.masks_file, "a custom scan needs a YAML/JSON file of masks"
            )

    def prepare(self) -> None:
        key = f"ablation.scans.{self.name}.masks_file"
        self.file_masks = load_custom_masks(self.cfg.masks_file, self.session.model.heads_per_layer, key)

    def masks(self) -> list[HeadMask]:
        return self.file_masks

    @classmethod
    def figure(cls, table: pd.DataFrame, path: Path, subject: str = "") -> Path:
        """One horizontal bar per mask, coloured by sign."""
        fig = new_figure(8, min(1.5 + 0.3 * len(table), 20))
        ax = fig.add_subplot()
        values = table[table_metric(table)[0]].to_numpy(float)
        ax.barh(range(len(table)), values, color=np.where(values >= 0, "tab:red", "tab:blue"))
        ax.set_yticks(range(len(table)), table["mask"].tolist())
        ax.invert_yaxis()
        ax.axvline(0, color="black", linewidth=0.8)
        ax.set(xlabel=table_metric(table)[1])
        set_title(ax, figure_title(table, subject))
        atomic_savefig(fig, path, dpi=120)
        return Path(path)
