"""`direct_effect`: each head's direct effect on the metric through the residual stream
(ablation/methods/direct_effect.py), in the metric's unit (logits for a logit difference), the mean over the score
points of the clean run, with its 95% bootstrap interval over the prompts (direct_effect_ci_low, _ci_high: 1000
resamples seeded by ablation.seed, intervals.py) and top_share (the share of resamples with the head among the top 5%
by |direct effect|; summary.json's `intervals` entry says how stable that top is). The second figure draws the largest
direct effects with their intervals.

With `backup_top_k` = k > 0 it also measures self-repair (Wang et al. 2022's backup name movers): the k heads of
largest direct effect are mean-ablated together (means over the evaluation set's own inputs, whatever the session's
mode), and it records the metric's change from that joint ablation beside the sum of the k heads' changes when each
is mean-ablated alone, and every head's direct effect again on the ablated model (`direct_effect_after`); heads whose
direct effect grew take over part of what was removed.

The table says what it holds: its `mode` is "clean" (direct effects are read on the unablated model, whatever the
session's mode; the self-repair record says "mean") and its `metric` the logit it reads, "logit_diff" or
"answer_logit" (the correct answer's direct logit, for a metric that reads no wrong answer: top1, answer_logprob...).
A model whose direct effects would not be exact (a final soft-cap, a masked-LM head, post-LN blocks) is refused by name.

On an encoder-decoder (methods/seq2seq_direct_effect.py) the table has a row per head of every kind (kind, layer,
head), read at the teacher-forced score points: the decoder's self-attention (`dec`) and cross-attention (`cross`)
heads have their direct effects, and each encoder head (`enc`) NaN with `direct_path` false, as it has no direct path
to the logits (summary.json's `no_direct_path` says why); the figure has a panel per kind with a direct path, and a
ranking (top_heads' rank_by=direct_effect) puts the encoder's heads last. Self-repair (backup_top_k) is one-stack."""

from pathlib import Path

import pandas as pd
import torch

from headcount.ablation.engine.evaluator import MaskEvaluator
from headcount.ablation.engine.heads import all_heads, head_name, top_heads
from headcount.ablation.engine.masks import HeadMask, masks_to_gates
from headcount.ablation.engine.modes import Mean, Replacements, mean_z
from headcount.ablation.methods.direct_effect import direct_effect_sums, direct_effects, refusal
from headcount.ablation.methods.seq2seq_direct_effect import NO_DIRECT_PATH, seq2seq_direct_effect_sums
from headcount.ablation.scans.base import KINDS, Scan, ScanResult
from headcount.ablation.scans.by_kind import kind_panels, with_kinds
from headcount.ablation.scans.intervals import BOOTSTRAP_RULE, interval_figure, score_intervals
from headcount.config.ablation import AblationConfig
from headcount.config.scans import DirectEffectSettings
from headcount.errors import ConfigError
from headcount.labels import KindRows, kind_head_label
from headcount.plotting import head_heatmap


@KINDS.register
class DirectEffectScan(Scan):
    kind = "direct_effect"
    ranks_heads = True
    doc = "each head's direct effect on the metric through the residual stream; with backup_top_k, self-repair"
    reads = Scan.reads | {"model", "batches", "device", "layer_head_tensor"}
    Settings = DirectEffectSettings

    @classmethod
    def check(cls, name: str, cfg: DirectEffectSettings, settings: AblationConfig) -> None:
        if cfg.backup_top_k < 0:
            raise ConfigError(f"ablation.scans.{name}.backup_top_k", cfg.backup_top_k, "must be 0 or more")

    def prepare(self) -> None:
        if (reason := refusal(self.session.model)) is not None:
            raise ConfigError(f"ablation.scans.{self.name}.kind", self.kind, f"is not exact on this model: {reason}")
        # a ranking for top_heads is prepared without settings (top_heads.prepare) and runs with the defaults
        k = (self.cfg or DirectEffectSettings(kind=self.kind)).backup_top_k
        if isinstance(self.session.model.heads_per_layer, KindRows) and k:
            allowed = "self-repair's joint mean ablation is one stack's; an encoder-decoder takes 0"
            raise ConfigError(f"ablation.scans.{self.name}.backup_top_k", k, allowed)
        n_heads = sum(self.session.model.heads_per_layer)
        if k >= n_heads:  # was clipped silently to every head
            raise ConfigError(
                f"ablation.scans.{self.name}.backup_top_k",
                k,
                f"must be fewer than the model's {n_heads} heads: backup heads are the others, whose effect grows",
            )

    def fingerprint_parts(self) -> tuple:
        return (self.kind, self.cfg.backup_top_k, BOOTSTRAP_RULE)

    def record(self) -> dict:
        """The session's columns, with the mode and metric of what the table holds (the module's docstring)."""
        reads = "logit_diff" if self.session.metric.needs_wrong else "answer_logit"
        return {**super().record(), "mode": "clean", "metric": reads}

    def title(self, what: str) -> str:
        """Read on the clean run, not under the session's mode (the self-repair panel says its mean ablation)."""
        return f"{self.name}: {what}, clean run\n{self.session.subject}"

    def compute(self, key: str) -> pd.DataFrame | ScanResult:
        session, hpl = self.session, self.session.model.heads_per_layer
        if isinstance(hpl, KindRows):
            return self.compute_by_kind(hpl)
        sums_ELH, points_E = direct_effect_sums(session.model, session.batches, session.metric)
        effect_LH = sums_ELH.sum(0) / max(int(points_E.sum()), 1)
        layers, heads = (list(x) for x in zip(*all_heads(hpl)))
        table = pd.DataFrame({"layer": layers, "head": heads, "direct_effect": effect_LH[layers, heads].numpy()})
        columns, entry = score_intervals(sums_ELH[:, layers, heads], points_E, "direct_effect", session.settings.seed)
        table = table.assign(**columns)
        summary = {"intervals": {self.name: entry}}
        k = self.cfg.backup_top_k
        if not k:
            return ScanResult(table, summary=summary)
        after_LH, record = self.backup(effect_LH, k)
        table["direct_effect_after"] = after_LH[layers, heads].numpy()
        return ScanResult(table, summary=summary | {"backup": {self.name: record}})

    def compute_by_kind(self, grid: KindRows) -> ScanResult:
        """An encoder-decoder's table: every head by kind, the encoder's NaN with direct_path false; intervals over the
        heads with a direct path."""
        session = self.session
        sums_ELH, points_E = seq2seq_direct_effect_sums(session.model, session.batches, session.metric)
        effect_LH = sums_ELH.sum(0) / max(int(points_E.sum()), 1)
        rows, heads = (list(x) for x in zip(*all_heads(grid)))
        table = with_kinds(pd.DataFrame({"layer": rows, "head": heads, "direct_effect": effect_LH[rows, heads]}), grid)
        table["direct_path"] = table["kind"] != "enc"
        direct = [(row, head) for row, head in zip(rows, heads) if grid.rows[row][0] != "enc"]
        d_rows, d_heads = (list(x) for x in zip(*direct))
        columns, entry = score_intervals(sums_ELH[:, d_rows, d_heads], points_E, "direct_effect", session.settings.seed)
        for name, values in columns.items():
            table[name] = float("nan")
            table.loc[table["direct_path"], name] = values
        summary = {"intervals": {self.name: entry}, "no_direct_path": {self.name: {"enc": NO_DIRECT_PATH}}}
        return ScanResult(table, summary=summary)

    def backup(self, effect_LH: torch.Tensor, k: int) -> tuple[torch.Tensor, dict]:
        """Mean-ablate the top k heads together: the direct effects after, and the record of the joint and single
        changes (the result's summary.json entry)."""
        session, hpl = self.session, self.session.model.heads_per_layer
        model, metric = session.model, session.metric
        top = top_heads(effect_LH, hpl, k)
        means = Replacements(Mean(), mean_z(model, session.batches, per_position=False))
        masks = [HeadMask("together", tuple(top))] + [HeadMask(head_name(*h), (h,)) for h in top]
        gates = masks_to_gates(masks, hpl).to(session.device)
        evaluator = MaskEvaluator(model, session.batches, means, metric=metric)
        base = evaluator.baseline()[metric.primary]
        changes = (evaluator.evaluate(gates)[metric.primary] - base).tolist()
        after_LH = direct_effects(model, session.batches, metric, gates[0], means)
        grew = [(head_name(*h), float(after_LH[h] - effect_LH[h])) for h in all_heads(hpl) if h not in top]
        grew = sorted((g for g in grew if g[1] > 0), key=lambda g: -g[1])
        record = {
            "mode": "mean",
            "metric": metric.name,
            "heads": [head_name(*h) for h in top],
            "together": changes[0],
            "single": dict(zip([head_name(*h) for h in top], changes[1:])),
            "sum_of_single": sum(changes[1:]),
            "grew": dict(grew[:10]),
        }
        return after_LH, record

    def use(self, table: pd.DataFrame) -> None:
        """Each head's direct effect at its grid row; an encoder head, with no direct path, ranks last (-inf; its NaN
        reads back from the CSV as an empty field)."""
        effects = table["direct_effect"]
        if "kind" in table:
            effects = pd.to_numeric(effects, errors="coerce").fillna(float("-inf"))
        self.session.hand(
            self.kind, self.session.layer_head_tensor(table.assign(direct_effect=effects), "direct_effect")
        )

    def figures(self, table: pd.DataFrame) -> list[Path | None]:
        metric = self.session.metric
        direction = "correct minus wrong answer" if metric.needs_wrong else "the correct answer's logit"
        title = self.title(f"direct effect onto {direction} ({metric.unit})")
        if "kind" in table:  # an encoder-decoder's: a panel per kind with a direct path (the encoder's has none)
            title = self.title(f"direct effect onto {direction} ({metric.unit}); encoder heads: no direct path")
            table = table[table["direct_path"]]
            figures = [kind_panels(table, self.path(".png"), "direct_effect", title, f"direct effect ({metric.unit})")]
        else:
            figures = [head_heatmap(table, self.path(".png"), "direct_effect", title, f"direct effect ({metric.unit})")]
        if "direct_effect_after" in table:
            grown = table.assign(growth=table["direct_effect_after"] - table["direct_effect"])
            title = self.title(f"direct effect's change after the top {self.cfg.backup_top_k} are mean-ablated")
            figures.append(head_heatmap(grown, self.path(".png", "_growth"), "growth", title, metric.unit))
        if "kind" in table:
            named = table.assign(
                mask=[kind_head_label(k, layer, head) for k, layer, head in table[["kind", "layer", "head"]].values]
            )
        else:
            named = table.assign(mask=[head_name(layer, head) for layer, head in zip(table["layer"], table["head"])])
        title = self.title("direct effects, the largest with their intervals")
        label = f"direct effect ({metric.unit})"
        figures.append(interval_figure(named, self.path(".png", "_intervals"), title, label, "direct_effect"))
        return figures

    def file_names(self) -> list[tuple[str, str]]:
        return [*super().file_names(), ("_intervals", ".png")]
