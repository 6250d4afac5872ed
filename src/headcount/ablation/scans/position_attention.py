"""`position_attention`: how much attention each head pays, from each scored position of a task's prompts, to each
of the task's named positions (ioi: from the end to IO, S1, S1+1, S2), the mean over the prompts that have the
position. Read off the clean model's attention patterns, so the same in every mode and metric. Name movers (Wang et
al. 2022) attend from the end to the indirect object more than to the subject.

With `from_position` (a named position, S2) the attention is read from that position of each prompt instead, to every
named position: induction heads attend from S2 to S1+1, duplicate-token heads to S1; a position after the query reads
0 (causal attention).

Each share has its 95% bootstrap interval over the prompts (attn_to_<position>_ci_low, _ci_high: a prompt's queries
drawn together, 1000 resamples seeded by 0, as the scan is the same in every mode; intervals.py).

On an encoder-decoder's task (translation_verb, translation_agreement: no named positions) each head's
`attn_to_changed` is the attention from the scored position to the tokens the counterpart changes in the sequence the
head reads: a cross-attention head's to the source's, a decoder self-attention head's to the decoder stream's; an
encoder head has no scored position (NaN, `scored_query` false); methods/seq2seq_position_attention.py."""

from pathlib import Path

import pandas as pd
import torch

from headcount.ablation.engine.heads import all_heads
from headcount.ablation.engine.metrics import Targets
from headcount.ablation.methods.seq2seq_position_attention import (
    NO_SCORED_POSITION,
    changed_attention_sums,
    changed_tokens,
)
from headcount.ablation.scans.base import KINDS, Scan, ScanResult
from headcount.ablation.scans.by_kind import kind_panels, with_kinds
from headcount.ablation.scans.intervals import BOOTSTRAP_RULE, score_intervals
from headcount.config.scans import PositionAttentionSettings
from headcount.errors import ConfigError
from headcount.labels import KindRows
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
        if isinstance(self.session.model.heads_per_layer, KindRows):  # reads the tokens its counterpart changes
            if self.cfg.from_position is not None:
                raise ConfigError(
                    f"ablation.scans.{self.name}.from_position",
                    self.cfg.from_position,
                    "an encoder-decoder's task names no positions: attention is read from its scored position (null)",
                )
            return
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
        parts = (self.kind, self.session.positions, *([] if start is None else [f"from {start}"]))
        return (*parts, BOOTSTRAP_RULE)

    def compute(self, key: str) -> pd.DataFrame | ScanResult:
        session = self.session
        if isinstance(session.model.heads_per_layer, KindRows):
            return self.compute_by_kind(session.model.heads_per_layer)
        names = [name for name in session.positions if name != "end"]
        L, H = session.model.n_layers, session.model.max_heads
        sums, counts = [], []  # per prompt: (K, L, H) attention summed over its queries, (K,) its queries
        for batch in session.batches:
            patterns = reads(["attn.pattern"], range(L))
            with torch.no_grad():
                session.model(batch["input_ids"], patterns)
            b, t = self.query_points(batch)
            B = len(batch["input_ids"])
            sums_BKLH = torch.zeros(B, len(names), L, H, dtype=torch.float64)
            counts_BK = torch.zeros(B, len(names), dtype=torch.float64)
            for k, name in enumerate(names):
                to = batch["named_pos"][b, session.positions.index(name)]
                has = to >= 0
                counts_BK[:, k].index_add_(0, b[has].cpu(), torch.ones(int(has.sum()), dtype=torch.float64))
                for layer in range(L):
                    pattern_BHTT = patterns.read("attn.pattern", layer)
                    h = pattern_BHTT.shape[1]
                    at_NH = pattern_BHTT[b[has], :, t[has], to[has]]
                    sums_BKLH[:, k, layer, :h].index_add_(0, b[has].cpu(), at_NH.double().cpu())
            sums.append(sums_BKLH)
            counts.append(counts_BK)
        sums_EKLH, counts_EK = torch.cat(sums), torch.cat(counts)
        hpl = session.model.heads_per_layer
        layers, heads = (list(x) for x in zip(*all_heads(hpl)))
        means = sums_EKLH.sum(0) / counts_EK.sum(0).clamp_min(1)[:, None, None]
        table = pd.DataFrame(
            {
                "layer": layers,
                "head": heads,
                **{f"attn_to_{n}": means[k, layers, heads].numpy() for k, n in enumerate(names)},
            }
        )
        for k, name in enumerate(names):  # each share's interval over the prompts (their queries drawn together)
            if counts_EK[:, k].sum() > 0:
                columns, _ = score_intervals(sums_EKLH[:, k][:, layers, heads], counts_EK[:, k], f"attn_to_{name}", 0)
                table = table.assign(**{c: v for c, v in columns.items() if c != "top_share"})
        return table

    def compute_by_kind(self, grid: KindRows) -> ScanResult:
        """An encoder-decoder's table: every head by kind, its share of attention on the tokens the counterpart
        changes; the encoder's NaN with scored_query false; intervals per kind over the prompts that change a token
        the kind reads."""
        session = self.session
        task = session.task.first(len(session.batches.examples["input_ids"]))
        changed = changed_tokens(task.examples(), task.examples(corrupted=True))
        sums_ELH, counts_EL = changed_attention_sums(session.model, session.batches, changed)
        rows, heads = (list(x) for x in zip(*all_heads(grid)))
        share_LH = sums_ELH.sum(0) / counts_EL.sum(0)[:, None]  # 0/0: no prompt changes a token the kind reads
        table = with_kinds(pd.DataFrame({"layer": rows, "head": heads, "attn_to_changed": share_LH[rows, heads]}), grid)
        table["scored_query"] = table["kind"] != "enc"
        for kind in ("dec", "cross"):
            counts_E = counts_EL[:, grid.kind_rows(kind)[0]]
            picked = [(row, head) for row, head in zip(rows, heads) if grid.rows[row][0] == kind]
            if counts_E.sum() == 0:
                continue
            k_rows, k_heads = (list(x) for x in zip(*picked))
            columns, _ = score_intervals(sums_ELH[:, k_rows, k_heads], counts_E, "attn_to_changed", 0)
            at = (table["kind"] == kind).to_numpy()
            for name in ("attn_to_changed_ci_low", "attn_to_changed_ci_high"):
                if name not in table:
                    table[name] = float("nan")
                table.loc[at, name] = columns[name]
        return ScanResult(table, summary={"no_scored_position": {self.name: {"enc": NO_SCORED_POSITION}}})

    def query_points(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """(prompt, position) of every query the attention is read from: the scored points, or from_position."""
        if self.cfg.from_position is None:
            return Targets.of(batch).where_BT.nonzero(as_tuple=True)
        at = batch["named_pos"][:, self.session.positions.index(self.cfg.from_position)]
        b = (at >= 0).nonzero()[:, 0]
        return b, at[b]

    def figures(self, table: pd.DataFrame) -> list[Path | None]:
        if "kind" in table:  # an encoder-decoder's: a panel per kind with a scored position (the encoder's has none)
            title = self.title("attention from the scored position to the tokens its counterpart changes (share)")
            shown = table[table["scored_query"]]
            return [kind_panels(shown, self.path(".png"), "attn_to_changed", title, "share of attention (fraction)")]
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
            if column.startswith("attn_to_") and not column.endswith(("_ci_low", "_ci_high"))
        ]
