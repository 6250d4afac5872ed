"""`position_attention`: how much attention each head pays, from each scored position of a task's prompts, to each
of the task's named positions (ioi: from the end to IO, S1, S1+1, S2), the mean over the prompts that have the
position. Read off the clean model's attention patterns, so the same in every mode and metric. Name movers (Wang et
al. 2022) attend from the end to the indirect object more than to the subject.

With `from_position` (a named position, S2) the attention is read from that position of each prompt instead, to every
named position: induction heads attend from S2 to S1+1, duplicate-token heads to S1; a position after the query reads
0 (causal attention)."""

from pathlib import Path

import pandas as pd
import torch

from headcount.ablation.engine.heads import all_heads
from headcount.ablation.engine.metrics import Targets
from headcount.ablation.scans.base import KINDS, Scan
from headcount.config.scans import PositionAttentionSettings
from headcount.errors import ConfigError
from headcount.model.intervention import reads
from headcount.plotting import head_heatmap


@KINDS.register
class PositionAttentionScan(Scan):
    kind = "position_attention"
    doc = "attention from each scored position to each of a task's named positions, per head"
    reads = Scan.reads | {"model", "batches", "positions", "task"}
    mode_independent = True
    Settings = PositionAttentionSettings

    def prepare(self) -> None:
        if self.session.task is None:
            raise ConfigError(f"ablation.scans.{self.name}", self.kind, "reads a task's named positions: name a task")
        if not [name for name in self.session.positions if name != "end"]:  # its table had no attention columns
            raise ConfigError(
                f"ablation.scans.{self.name}",
                self.kind,
                f"reads a task's named positions, and task {self.session.task.name} names none but its end: use a "
                "task that names them (ioi, kv_retrieval, needle)",
            )
        start = self.cfg.from_position
        if start is not None and start not in self.session.positions:
            raise ConfigError(
                f"ablation.scans.{self.name}.from_position",
                start,
                f"is not a named position of task {self.session.task.name}: one of {', '.join(self.session.positions)}",
            )

    def fingerprint_parts(self) -> tuple:
        start = self.cfg.from_position
        return (self.kind, self.session.positions, *([] if start is None else [f"from {start}"]))

    def compute(self, key: str) -> pd.DataFrame:
        session = self.session
        names = [name for name in session.positions if name != "end"]
        L, H = session.model.n_layers, session.model.max_heads
        sums = torch.zeros(len(names), L, H, dtype=torch.float64)
        counts = torch.zeros(len(names), dtype=torch.float64)
        for batch in session.batches:
            patterns = reads(["attn.pattern"], range(L))
            with torch.no_grad():
                session.model(batch["input_ids"], patterns)
            b, t = self.query_points(batch)
            for k, name in enumerate(names):
                to = batch["named_pos"][b, session.positions.index(name)]
                has = to >= 0
                counts[k] += float(has.sum())
                for layer in range(L):
                    pattern_BHTT = patterns.read("attn.pattern", layer)
                    h = pattern_BHTT.shape[1]
                    at_NH = pattern_BHTT[b[has], :, t[has], to[has]]
                    sums[k, layer, :h] += at_NH.double().sum(0).cpu()
        hpl = session.model.heads_per_layer
        layers, heads = (list(x) for x in zip(*all_heads(hpl)))
        means = sums / counts.clamp_min(1)[:, None, None]
        return pd.DataFrame(
            {
                "layer": layers,
                "head": heads,
                **{f"attn_to_{n}": means[k, layers, heads].numpy() for k, n in enumerate(names)},
            }
        )

    def query_points(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """(prompt, position) of every query the attention is read from: the scored points, or from_position."""
        if self.cfg.from_position is None:
            return Targets.of(batch).where_BT.nonzero(as_tuple=True)
        at = batch["named_pos"][:, self.session.positions.index(self.cfg.from_position)]
        b = (at >= 0).nonzero()[:, 0]
        return b, at[b]

    def figures(self, table: pd.DataFrame) -> list[Path | None]:
        start = "the scored position" if self.cfg.from_position is None else self.cfg.from_position
        return [
            head_heatmap(
                table,
                self.path(".png", f"_{column}"),
                column,
                self.title(f"attention from {start} {column.replace('_', ' ')} (share)"),
                "share of attention (fraction)",
            )
            for column in table.columns
            if column.startswith("attn_to_")
        ]
