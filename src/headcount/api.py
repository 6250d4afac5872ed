"""The Python API: open a finished run, evaluate any head masks on it, run a scan, read its results as tables.

    import headcount

    run = headcount.load_run("outputs/experiments/induction_heads")
    run.model, run.config, run.eval_batches  # in eval mode; the run's config; the batches the scans evaluate on
    run.evaluate({"prev": [(0, 3)]}, mode="mean")  # loss, acc and deltas per mask, as a scan computes them
    run.scan("single_head", mode="resample")  # a scan kind with the run's settings; files in <run>/ablation/
    run.results("single_head")  # its tables of every mode, stacked, with a `mode` column

A Run reads everything from the run directory alone, so it opens any run headcount-train wrote (or a sweep's job):
`evaluate` builds the evaluator the scans build (ablation/evaluation.py) and writes nothing; `scan` runs what
`headcount-ablate run_dir=<run> ablation=<name> ablation.mode=<mode>` runs, under the run's lock. This module sits with
the commands at the top of the import order: it may use every stage below it.
"""

from functools import cached_property
from pathlib import Path

import pandas as pd
import torch
from omegaconf import DictConfig, OmegaConf

from headcount import run_lock
from headcount.ablation.evaluation import Evaluation, EvaluationSet, evaluation, evaluation_set
from headcount.ablation.masks import MaskSpec, masks_to_gates, requested_masks
from headcount.ablation.results import read_csv, result_path, with_record
from headcount.ablation.scans.mask_scan import scan_table
from headcount.ablation.session import AblationSession, resolve_device, typed_ablation
from headcount.ablation.summary import read_mode_summary, read_summary
from headcount.config.ablation import AblationConfig, Mode, ScanConfig, validate_ablation_config
from headcount.errors import ConfigError
from headcount.model.transformer import Transformer
from headcount.run_dir import FinishedRun, RunPaths
from headcount.run_dir import load_run as open_finished_run

MODES = [mode.value for mode in Mode]


class Run:
    """A finished training run: its model, config and evaluation data, and its ablation results.

    model: the trained Transformer in eval mode, in float32 (as the scans evaluate it) on `device`.
    config: the run's resolved config (.hydra/config.yaml): model, data, trainer, ablation settings, seed.
    settings: the config's ablation section, typed; `evaluate` and `scan` use it, with the mode they are given.
    """

    def __init__(self, run_dir: str | Path, device: str | None = None):
        self.path = Path(run_dir)
        self.finished: FinishedRun = open_finished_run(self.path)
        self.config: DictConfig = self.finished.config
        self.settings: AblationConfig = typed_ablation(self.config.get("ablation") or OmegaConf.create({}))
        # The scans the run's config lists: scan(name) takes their settings (pairs' top_k, custom's masks_file).
        self.scan_settings: dict[str, ScanConfig] = self.settings.scans
        self.settings.scans = {}
        validate_ablation_config(self.settings)
        self.device = resolve_device(device or self.settings.device)
        self.model: Transformer = self.finished.model.to(self.device, torch.float32).eval()
        self._evaluations: dict[str, tuple[EvaluationSet, Evaluation]] = {}

    def __repr__(self) -> str:
        return f"Run({str(self.path)!r})"

    @property
    def ablation_dir(self) -> Path:
        return RunPaths(self.path).ablation

    @cached_property
    def eval_batches(self) -> list[dict[str, torch.Tensor]]:
        """The first `ablation.n_eval` examples of `ablation.split` in `ablation.batch_size` batches on `device`:
        dicts of input_ids (B, T) int64 and loss_mask (B, T) bool, where loss_mask marks the positions that count."""
        return self.finished.eval_batches(self.device)

    @cached_property
    def metrics(self) -> dict:
        """metrics.json: the final val/test loss and accuracy, parameters, FLOPs per token, tokens/s."""
        return OmegaConf.to_container(OmegaConf.load(RunPaths(self.path).metrics))

    def evaluate(self, masks: dict[str, MaskSpec] | list[MaskSpec], mode: str | None = None) -> pd.DataFrame:
        """Loss and accuracy with each mask's heads ablated, one row per mask: mask, layer, head (where the mask is one
        head), mode, loss, acc, delta_loss and delta_acc against the unmasked model, n_heads_off, then how it was
        computed (split, n_eval, n_targets, reference_split, n_reference). The numbers are exactly a scan's for the
        same mask: the same evaluator on the same data. Writes nothing.

        masks: a mapping name -> heads off, or a list of masks; a mask is a list of (layer, head) pairs or "L1H3"
        names, a name such as "L0H3+L1H2", or a HeadMask. mode: zero, mean or resample (default: the run's
        ablation.mode); mean and resample draw on the run's ablation.reference_split."""
        settings = self.mode_settings(mode)
        head_masks = requested_masks(masks, self.model.heads_per_layer)
        if not head_masks:
            raise ConfigError("masks", masks, "give at least one mask")
        data, evaluated = self.evaluation(settings)
        baseline = evaluated.evaluator.baseline()
        totals = evaluated.evaluator.accumulate(masks_to_gates(head_masks, self.model.heads_per_layer))
        table = scan_table("evaluate", settings.mode.value, head_masks, totals, baseline).drop(columns="scan")
        reference = data.reference
        record = {
            "split": settings.split,
            "n_eval": len(data.examples["input_ids"]),
            "n_targets": baseline["n_targets"],
            "reference_split": None if reference is None else settings.reference_split,
            "n_reference": None if reference is None else len(reference["input_ids"]),
        }
        return with_record(table, record)

    def scan(self, name: str, mode: str | None = None, **scan_settings) -> pd.DataFrame:
        """Run the scan `name` (a kind: single_head, layer, leave_one_in, pairs, custom, importance, pruning,
        l0_gates, head_scores, baseline) with the run's settings in `mode`, as headcount-ablate does: results go to
        <run>/ablation/ and summary.json, and a rerun with unchanged settings reads them back. A name the run's
        config lists keeps its settings there; scan_settings set the scan's own keys (top_k=6 for pairs,
        masks_file="masks.yaml" for custom). Returns the scan's table."""
        settings = self.mode_settings(mode)
        settings.prune.export = False
        own = OmegaConf.structured(self.scan_settings.get(name, ScanConfig(kind=name)))
        settings.scans = {name: OmegaConf.to_object(OmegaConf.merge(own, scan_settings))}
        config = self.config.copy()
        config.ablation = OmegaConf.structured(settings)
        already_held = run_lock.holds(self.path)
        run_lock.acquire(self.path, "headcount.load_run(...).scan")
        try:
            session = AblationSession(config, self.path)
            return session.scans[name].run()
        finally:
            if not already_held:
                run_lock.release(self.path)

    def results(self, scan: str, mode: str | None = None) -> pd.DataFrame:
        """The table <run>/ablation/<scan>[.<mode>].csv holds: of one mode, or with mode=None of every mode the scan
        has results in, stacked (their `mode` column tells them apart). A result no mode changes (head_scores) has
        one table and no mode column."""
        modes = MODES if mode is None else [Mode(mode).value]
        paths = dict.fromkeys(result_path(self.ablation_dir, scan, m, ".csv") for m in modes)
        tables = [read_csv(path) for path in paths if path.exists()]
        if not tables:
            done = ", ".join(self.results_index()["scan"].unique()) or "none"
            which = "any mode" if mode is None else f"{mode} mode"
            raise ConfigError(
                "scan", scan, f"has no results in {which} in {self.ablation_dir} (run.scan computes them; done: {done})"
            )
        return pd.concat(tables, ignore_index=True)

    def results_index(self) -> pd.DataFrame:
        """One row per scan result in <run>/ablation/: scan, kind, mode (empty where no mode changes it), rows, csv."""
        summary = read_summary(self.ablation_dir / "summary.json")
        sections = [(mode, section) for mode, section in summary.get("modes", {}).items()]
        sections.append(("", summary.get("mode_independent", {})))
        rows = [
            {"scan": name, "kind": entry["kind"], "mode": mode, "rows": entry["rows"], "csv": entry["files"][0]}
            for mode, section in sections
            for name, entry in section.get("scans", {}).items()
        ]
        return pd.DataFrame(rows, columns=["scan", "kind", "mode", "rows", "csv"])

    def summary(self, mode: str = "zero") -> dict:
        """The section of <run>/ablation/summary.json for `mode`: baseline, most important head, prunable fractions."""
        return read_mode_summary(self.ablation_dir, Mode(mode).value)

    # --- helpers ----------------------------------------------------------------------------------------------

    def mode_settings(self, mode: str | None) -> AblationConfig:
        """A copy of the run's ablation settings in `mode` (default: the run's own)."""
        settings = typed_ablation(OmegaConf.structured(self.settings))
        if mode is not None:
            if mode not in MODES:
                raise ConfigError("mode", mode, f"allowed: {', '.join(MODES)}")
            settings.mode = Mode(mode)
        return settings

    def evaluation(self, settings: AblationConfig) -> tuple[EvaluationSet, Evaluation]:
        """The evaluation set and evaluator for the settings' mode, built once per mode."""
        mode = settings.mode.value
        if mode not in self._evaluations:
            data = evaluation_set(self.finished, settings)
            self._evaluations[mode] = data, evaluation(settings, self.model, data, None, self.device)
        return self._evaluations[mode]


def load_run(run_dir: str | Path, device: str | None = None) -> Run:
    """The finished run in run_dir (the folder headcount-train wrote: .hydra/, checkpoints/, metrics.json), its model
    in eval mode on `device` (default: the run's ablation.device, `auto`: CUDA when there is one)."""
    return Run(run_dir, device)


__all__ = ["Run", "load_run"]
