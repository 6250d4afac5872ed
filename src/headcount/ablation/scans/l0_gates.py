"""`l0_gates`: Voita et al.'s learned hard-concrete gates (ablation/methods/l0_gates.py), trained on reference_split,
their binary masks evaluated exactly on the eval split like every other mask. Its figure: the share of runs that keep
each head. The structural export with order=l0_gates removes the heads a run's mask closes. On an encoder-decoder the
gates cover its three kinds of heads (one grid, labels.KindRows): the table has a kind column and the kind's own layer,
the figure a panel per kind."""

from dataclasses import asdict
from pathlib import Path

import pandas as pd
from torch import Tensor

from headcount.ablation.engine.metrics import require_differentiable
from headcount.ablation.engine.modes import resample_sources
from headcount.ablation.methods.l0_gates import l0_gates_table, train_l0_gates
from headcount.ablation.scans.base import KINDS, Scan, ScanResult
from headcount.ablation.scans.by_kind import kind_panels, with_kinds
from headcount.config.ablation import AblationConfig, l0_targets, validate_l0_config
from headcount.config.scans import L0GatesSettings
from headcount.data.examples import to_batches
from headcount.plotting import head_heatmap


@KINDS.register
class L0GatesScan(Scan):
    kind = "l0_gates"
    doc = "Voita et al.'s learned hard-concrete gates, their masks evaluated exactly"
    reads = Scan.reads | {
        "model",
        "batches",
        "device",
        "evaluator",
        "mode",
        "replacements",
        "run",
        "task",
        "layer_head_tensor",
    }
    Settings = L0GatesSettings

    @classmethod
    def check(cls, name: str, cfg: L0GatesSettings, settings: AblationConfig) -> None:
        validate_l0_config(cfg.l0, None, f"ablation.scans.{name}.l0")
        require_differentiable(settings.metric, f"the {name} scan (L0 gates trained on the metric)")

    def prepare(self) -> None:
        validate_l0_config(self.cfg.l0, sum(self.session.model.heads_per_layer), f"ablation.scans.{self.name}.l0")

    def fingerprint_parts(self) -> tuple:
        s = self.session.settings
        resampled = ("resample paired within the reference split",) if self.session.mode.pairs_examples else ()
        return (self.kind, asdict(self.cfg.l0), self.reference_split(), s.n_reference, *resampled)

    def compute(self, key: str) -> ScanResult:
        session, s, l0 = self.session, self.session.settings, self.cfg.l0
        batches = self.training_batches()
        train = lambda target: train_l0_gates(  # noqa: E731
            session.model, batches, l0, target, session.replacements, s.progress, session.metric
        )
        results = [train(target) for target in l0_targets(l0)]
        table = l0_gates_table(results, lambda gates_MLH: session.evaluator.evaluate(gates_MLH.to(session.device)))
        table = with_kinds(table, session.model.heads_per_layer)  # an encoder-decoder's kind and kind's layer
        runs = table.drop_duplicates("target_heads" if l0.target_heads is not None else "n_kept")
        primary = session.metric.primary
        runs = [
            {"target_heads": r["target_heads"], "n_kept": int(r["n_kept"]), primary: float(r[primary])}
            for _, r in runs.iterrows()
        ]
        return ScanResult(table, summary={"l0_gates": runs})

    def training_batches(self) -> list[dict]:
        """What the gates train on: the reference split of the run's data (not the split they are evaluated on), or
        a task's own prompts (a task has no other). Under resample, each reference example takes another's z."""
        session, s = self.session, self.session.settings
        if session.task is not None:
            return session.batches
        reference = session.run.examples(self.reference_split(), s.n_reference, "ablation.reference_split")
        if session.mode.pairs_examples:
            n = len(reference["input_ids"])
            source = resample_sources(n, n, s.seed, same_split=True)
            reference["source_ids"] = reference["input_ids"][source]
            for column in ("src_ids", "src_mask"):  # an encoder-decoder's source pairs with its target
                if column in reference:
                    reference[f"source_{column}"] = reference[column][source]
        return to_batches(reference, s.batch_size, session.device)

    def reference_split(self) -> str:
        return self.session.settings.reference_split or "train"

    def record(self) -> dict:
        """The gates train on the reference split whatever the mode: its name and size belong to every table."""
        session, s = self.session, self.session.settings
        if session.task is not None:
            return session.record
        split = self.reference_split()
        n_reference = min(s.n_reference, len(session.run.splits[split]))
        return {**session.record, "reference_split": split, "n_reference": n_reference}

    def use(self, table: pd.DataFrame) -> None:
        self.session.hand(self.kind, table)  # the learned masks, which an l0_gates export reads

    def figures(self, table: pd.DataFrame) -> list[Path | None]:
        by = ["kind", "layer", "head"] if "kind" in table else ["layer", "head"]
        kept = table.groupby(by, as_index=False)["kept"].mean().rename(columns={"kept": "kept_share"})
        title = self.title(f"share of {len(l0_targets(self.cfg.l0))} L0 run(s) that keep each head")
        label = "runs keeping the head (fraction)"
        if "kind" in table:  # an encoder-decoder: a panel per kind of head
            return [kind_panels(kept, self.path(".png"), "kept_share", title, label)]
        return [head_heatmap(kept, self.path(".png"), "kept_share", title, label)]


def l0_keep_gates(session, target_heads: int | None) -> Tensor:
    """(L, H) keep-gates of the binary mask the session's l0_gates scan learned for target_heads (its only run if
    None): the table it handed over, having run before the export that needs it."""
    table = session.provided(L0GatesScan.kind)
    if target_heads is not None:
        table = table[table["target_heads"] == target_heads]
    return session.layer_head_tensor(table, "kept").float()
