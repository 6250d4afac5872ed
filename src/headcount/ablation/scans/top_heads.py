"""`top_heads`: do a few heads carry the behaviour? The `top_fraction` of all heads ranked highest by another scan's
per-head result (`rank_by`: single_head's damage, direct_effect, retrieval_scores, attribution's estimated damage,
importance) switched off together, beside `random_sets` sets of as many heads drawn at random (seeded by
ablation.seed). One row per set, with the metric, its delta and, on a task with corrupted prompts, gap_fraction: in
patch mode, the share of the clean-to-corrupted gap the set removes. On an encoder-decoder the heads are its grid's, of
every kind (named enc.L0H1+cross.L1H0), ranked by a scan it takes (single_head, importance)."""

from pathlib import Path

import pandas as pd
import torch

from headcount.ablation.engine.heads import all_heads, top_heads
from headcount.ablation.engine.masks import HeadMask, joined_name
from headcount.ablation.scans.base import KINDS
from headcount.ablation.scans.custom import CustomScan
from headcount.ablation.scans.mask_scan import MaskScan
from headcount.config.ablation import AblationConfig
from headcount.config.scans import TopHeadsSettings
from headcount.errors import ConfigError


@KINDS.register
class TopHeadsScan(MaskScan):
    kind = "top_heads"
    doc = "the top fraction of heads by another scan, off together, beside random sets of as many"
    reads = MaskScan.reads | {"model"}
    Settings = TopHeadsSettings

    @classmethod
    def check(cls, name: str, cfg: TopHeadsSettings, settings: AblationConfig) -> None:
        key = f"ablation.scans.{name}"
        if not KINDS.get(cfg.rank_by, f"{key}.rank_by").ranks_heads:
            rankers = ", ".join(kind for kind in KINDS if KINDS[kind].ranks_heads)
            raise ConfigError(f"{key}.rank_by", cfg.rank_by, f"ranks no heads; allowed: {rankers}")
        if not 0 < cfg.top_fraction <= 1:
            raise ConfigError(f"{key}.top_fraction", cfg.top_fraction, "must be in (0, 1]: a share of all heads")
        if cfg.random_sets < 0:
            raise ConfigError(f"{key}.random_sets", cfg.random_sets, "must be 0 or more")

    @classmethod
    def variant_of(cls, cfg: TopHeadsSettings) -> tuple[str, ...]:
        """Another ranking picks other heads: a table apart (top_heads.zero.by_retrieval_scores.csv), the default's
        (single_head) keeping its plain name."""
        return () if cfg.rank_by == TopHeadsSettings().rank_by else (f"by_{cfg.rank_by}",)

    def prepare(self) -> None:
        """The ranking scan's own checks, before any work: it runs only when top_heads asks for its ranking (an
        encoder-decoder's rankings are checked with its scans, ablation/seq2seq_checks.py)."""
        try:
            KINDS[self.cfg.rank_by](self.cfg.rank_by, None, self.session).prepare()
        except ConfigError as error:
            key = f"ablation.scans.{self.name}.rank_by"
            raise ConfigError(key, self.cfg.rank_by, f"cannot rank these heads: {error.allowed}") from None

    def needs(self) -> list[str]:
        return [self.cfg.rank_by]

    def fingerprint_parts(self) -> tuple:
        return (*super().fingerprint_parts(), self.cfg.rank_by)

    def masks(self) -> list[HeadMask]:
        session, hpl = self.session, self.session.model.heads_per_layer
        heads = all_heads(hpl)
        k = max(1, round(self.cfg.top_fraction * len(heads)))
        score_LH = session.provided(self.cfg.rank_by)
        top = tuple(sorted(top_heads(score_LH, hpl, k)))
        masks = [HeadMask(f"top {k} by {self.cfg.rank_by}: {joined_name(top, hpl)}", top)]
        for s in range(self.cfg.random_sets):
            pick = torch.randperm(len(heads), generator=torch.Generator().manual_seed(session.settings.seed + s))
            chosen = tuple(sorted(heads[i] for i in pick[:k].tolist()))
            seed = session.settings.seed + s
            masks.append(HeadMask(f"random {k} (seed {seed}): {joined_name(chosen, hpl)}", chosen))
        return masks

    @classmethod
    def figure(cls, table: pd.DataFrame, path: Path, subject: str = "") -> Path:
        return CustomScan.figure(table, path, subject)


def top_and_random(table: pd.DataFrame) -> tuple[pd.Series, pd.DataFrame]:
    """A top_heads table's row of the top heads, and its rows of random sets."""
    return table[table["mask"].str.startswith("top ")].iloc[0], table[table["mask"].str.startswith("random ")]
