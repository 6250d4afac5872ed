"""`retrieval_scores`: each head's retrieval score (Wu et al. 2024): on a copying task (task=needle), the share of
the copied tokens that the head copies and pastes, i.e. at whose scored position the head's strongest attention lands
on the context token being copied (the task's named position needle<i> for the i-th scored token of a prompt) while
the model's top prediction is that token. Read off the clean model, so the same in every mode and metric."""

from pathlib import Path

import pandas as pd
import torch

from headcount.ablation.engine.heads import all_heads
from headcount.ablation.engine.metrics import Targets
from headcount.ablation.scans.base import KINDS, Scan
from headcount.errors import ConfigError
from headcount.model.intervention import reads
from headcount.plotting import head_heatmap


@KINDS.register
class RetrievalScoresScan(Scan):
    kind = "retrieval_scores"
    ranks_heads = True
    doc = "Wu et al.'s retrieval score: how often a head's strongest attention lands on the token the model copies"
    reads = Scan.reads | {"model", "batches", "positions", "layer_head_tensor"}
    mode_independent = True

    def prepare(self) -> None:
        if "needle0" not in self.session.positions:
            raise ConfigError(
                f"ablation.scans.{self.name}",
                self.kind,
                "needs a copying task whose prompts name "
                "the context token each scored token copies (needle0, needle1, ...): task=needle",
            )

    def compute(self, key: str) -> pd.DataFrame:
        session, model = self.session, self.session.model
        L, H = model.n_layers, model.max_heads
        hits = torch.zeros(L, H, dtype=torch.float64)
        n_copied = 0
        for batch in session.batches:
            patterns = reads(["attn.pattern"], range(L))
            with torch.no_grad():
                logits_BTV = model(batch["input_ids"], patterns)
            targets = Targets.of(batch)
            b, t = targets.where_BT.nonzero(as_tuple=True)  # row-major: a prompt's points in order
            order = torch.cat([torch.arange(int(n)) for n in targets.where_BT.sum(1)])
            columns = torch.tensor([session.positions.index(f"needle{i}") for i in order.tolist()], dtype=torch.long)
            source = batch["named_pos"][b, columns]
            copied = logits_BTV[b, t].argmax(-1) == targets.answer_N
            n_copied += len(t)
            for layer in range(L):
                pattern_BHTT = patterns.read("attn.pattern", layer)
                strongest_NH = pattern_BHTT[b, :, t].argmax(-1)
                h = pattern_BHTT.shape[1]
                hits[layer, :h] += ((strongest_NH == source[:, None]) & copied[:, None]).double().sum(0).cpu()
        layers, heads = (list(x) for x in zip(*all_heads(session.model.heads_per_layer)))
        scores = hits / max(n_copied, 1)
        return pd.DataFrame({"layer": layers, "head": heads, "retrieval_score": scores[layers, heads].numpy()})

    def use(self, table: pd.DataFrame) -> None:
        self.session.hand(self.kind, self.session.layer_head_tensor(table, "retrieval_score"))

    def figures(self, table: pd.DataFrame) -> list[Path | None]:
        title = self.title("retrieval score (share of copied tokens a head copies and pastes)")
        return [head_heatmap(table, self.path(".png"), "retrieval_score", title, "retrieval score (fraction)")]
