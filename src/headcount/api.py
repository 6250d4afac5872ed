"""The Python API: open a finished run, evaluate any head masks on it, run a scan, read its results as tables.

    import headcount

    run = headcount.load_run("outputs/experiments/induction_heads")
    run.model, run.config, run.eval_batches  # in eval mode; the run's config; the batches the scans evaluate on
    run.evaluate({"prev": [(0, 3)]}, mode="mean")  # loss, acc and deltas per mask, as a scan computes them
    run.evaluate(["L1H3"], mode="patch", metric="logit_diff", task="prompts.jsonl")  # a behaviour, patched
    run.evaluate(edges_removed=["L0H3 -> L1H2.k"], mode="zero")  # edges (api_edges.py); circuit=[...] keeps only those
    run.scan("single_head", mode="resample")  # a scan kind with the run's settings; files in <run>/ablation/
    run.results("single_head")  # its tables of every mode and metric, stacked, with `mode` and `metric` columns

A Run reads everything from the run directory alone, so it opens any run headcount-train wrote (or a sweep's job, or
a pretrained model's run made by headcount-ablate): `evaluate` builds the evaluator the scans build
(ablation/engine/evaluation.py) and writes nothing; `scan` runs what `headcount-ablate run_dir=<run> ablation=<name>
ablation.mode=<mode>` runs, under the run's lock. A task is named as on the command line's task=...: a source
("ioi", "kv_retrieval", "needle"), a prompts file's path, or a mapping of task.* keys. This module sits with the
commands at the top of the import order: it may use every stage below it.
"""

import dataclasses
from functools import cached_property
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from omegaconf import DictConfig, OmegaConf

from headcount import run_lock
from headcount.ablation.checks import validate_settings
from headcount.ablation.encoder_checks import refuse_decoder_only, refuse_edges
from headcount.ablation.engine.evaluation import (
    Evaluation,
    EvaluationSet,
    counterpart_baseline,
    evaluation,
    evaluation_set,
    run_task,
    task_config,
)
from headcount.ablation.engine.masks import MaskSpec, masks_to_gates, requested_masks
from headcount.ablation.plan import plan
from headcount.ablation.records.address import ResultAddress, result_folders
from headcount.ablation.records.results import read_checked, with_record
from headcount.ablation.records.summary import read_summary
from headcount.ablation.scans.base import ScanSettings, typed_scan, typed_scans
from headcount.ablation.scans.mask_scan import scan_table
from headcount.ablation.seq2seq_checks import refuse_one_stack_only, refuse_seq2seq_edges
from headcount.ablation.session import AblationSession, resolve_device, typed_ablation
from headcount.api_edges import (
    EdgeSets,
    Rankings,
    checked_rankings,
    evaluate_edges,
    requested_edge_sets,
    score_rankings,
)
from headcount.api_stability import circuit_size, seed_stability, seed_tasks
from headcount.config import typed
from headcount.config.ablation import AblationConfig, mode_setting_keys
from headcount.config.task import TaskConfig
from headcount.config.train import TrainerConfig
from headcount.errors import ConfigError
from headcount.model.encoder_decoder import EncoderDecoder
from headcount.model.transformer import Transformer
from headcount.run_dir import FinishedRun, RunPaths
from headcount.run_dir import load_run as open_finished_run
from headcount.tasks import SOURCES, TaskSet, task_name

TaskSpec = str | dict | TaskConfig | None


class Run:
    """A finished run: its model, config and evaluation data, and its ablation results.

    model: the trained Transformer in eval mode, in float32 (as the scans evaluate it) on `device`.
    config: the run's resolved config (.hydra/config.yaml): model, data, trainer, ablation settings, seed.
    settings: the config's ablation section, typed; `evaluate` and `scan` use it, with the mode they are given.
    """

    def __init__(self, run_dir: str | Path, device: str | None = None):
        self.path = Path(run_dir)
        self.finished: FinishedRun = open_finished_run(self.path)
        self.config: DictConfig = self.finished.config
        ablation = OmegaConf.to_container(self.config.get("ablation") or OmegaConf.create({}))
        scans = ablation.pop("scans", None) or {}
        self.settings: AblationConfig = typed_ablation(OmegaConf.create(ablation))
        # The scans the run's config lists: scan(name) takes their settings (pairs' top_k, custom's masks_file). An
        # entry without a kind was never selected (config/ablation.py unselected_scans_dropped).
        self.scan_settings: dict[str, ScanSettings] = typed_scans({n: s for n, s in scans.items() if s.get("kind")})
        validate_settings(self.settings, task_config(self.config))
        self.device = resolve_device(device or self.settings.device)
        self.model: Transformer = self.finished.model.to(self.device, torch.float32).eval()
        self._evaluations: dict[str, tuple[EvaluationSet, Evaluation]] = {}
        self._tasks: dict[str, TaskSet | None] = {}

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
        """metrics.json: the final val/test loss and accuracy, parameters, FLOPs per token, tokens/s. A pretrained
        model ablated as it is (headcount-ablate model.pretrained=...) was never trained or evaluated: ConfigError."""
        path = RunPaths(self.path).metrics
        if not path.exists():
            raise ConfigError(
                "run_dir",
                str(self.path),
                "has no metrics.json: it holds a pretrained model ablated as it is (headcount-ablate "
                "model.pretrained=...), never trained or evaluated; its baseline loss is "
                "run.summary(mode)['baseline_loss']",
            )
        return OmegaConf.to_container(OmegaConf.load(path))

    def task(self, task: TaskSpec = None) -> TaskSet | None:
        """The task `task` names (default: the run's config's, if it names one), encoded for the model: its prompts'
        tokens, answers, corrupted counterparts and named positions; None for the run's own data."""
        cfg = self.task_settings(task)
        key = "" if cfg is None else OmegaConf.to_yaml(OmegaConf.structured(cfg))
        if key not in self._tasks:
            self._tasks[key] = run_task(self.config, self.model, cfg) if cfg is not None else None
        return self._tasks[key]

    def evaluate(
        self,
        masks: dict[str, MaskSpec] | list[MaskSpec] | None = None,
        mode: str | None = None,
        metric: Any = None,
        task: TaskSpec = None,
        *,
        edges_removed: EdgeSets | None = None,
        circuit: EdgeSets | None = None,
        **settings: Any,
    ) -> pd.DataFrame:
        """The metric with each mask's heads ablated, one row per mask: mask, layer, head (where the mask is one
        head), [position], mode, the metric's columns (loss and acc for loss) and their deltas against the unmasked
        model, [gap_fraction, on a task with corrupted prompts], n_heads_off, then how it was computed (metric,
        split, n_eval, n_targets, reference_split, n_reference). The numbers are exactly a scan's for the same mask:
        the same evaluator on the same data. Writes nothing.

        masks: a mapping name -> heads off, or a list of masks; a mask is a list of (layer, head) pairs or "L1H3"
        names, a name such as "L0H3+L1H2" (on a task, "L1H3@S2" at one named position), or a HeadMask.
        mode: a mode's name (headcount-ablate --list; default: the run's ablation.mode). metric: a metric name or
        {"_target_": ...} (default: the run's, else loss on the data, logit_diff on a task with wrong answers).
        task: as on the command line (a source such as "ioi", a prompts file, a mapping of task.* keys); default:
        the run's own task, else its data. settings: other ablation.* keys (patch_direction="denoise", ...).

        Instead of masks, edges (named as the edge scans name them, "L0H3 -> L1H2.k", "L1.mlp -> logits"), in a mode
        that corrupts every sender: edges_removed=[...] removes those edges, each receiver reading the mode's
        replacement from them and clean outputs from every other edge; circuit=[...] keeps only those, every other
        edge removed. A list is one set (a row named "edges_removed" or "circuit"), a mapping name -> list one row
        per set. The row has n_edges_removed in place of n_heads_off and `faithfulness`, the share of the clean-to-
        every-edge-removed gap the kept edges keep (headcount/api_edges.py)."""
        given = {"masks": masks, "edges_removed": edges_removed, "circuit": circuit}
        given = [name for name, value in given.items() if value is not None]
        if len(given) != 1:
            what = ", ".join(given) or "none"
            raise ConfigError("evaluate", what, "give exactly one of masks, edges_removed= or circuit=")
        s = self.mode_settings(mode, metric, **settings)
        checked = validate_settings(s, self.task_settings(task))
        source = None if checked.task is None else str(checked.task.source)
        refuse_decoder_only(s, source, self.model.cfg.causal, isinstance(self.model, EncoderDecoder))
        if isinstance(self.model, EncoderDecoder):
            if masks is None:
                refuse_seq2seq_edges(given[0])
            # the masks given here, not the scans the run's config lists
            refuse_one_stack_only(
                dataclasses.replace(s, scans={}), None if checked.task is None else str(checked.task.source)
            )
        if masks is None:
            refuse_edges(self.model)
        planned = plan(checked, lambda _: self.task(task), self.ablation_dir)
        if masks is None:
            sets = requested_edge_sets(self.model, edges_removed, circuit, s)
            data, evaluated = self.evaluation(s, planned.mode, planned.metric, planned.task)
            table, n_points = evaluate_edges(self.model, sets, edges_removed is not None, s, planned, data, evaluated)
            return with_record(table, self.evaluation_record(data, planned, n_points))
        mode_object, chosen_metric, task_set, positions = planned.mode, planned.metric, planned.task, planned.positions
        head_masks = requested_masks(masks, self.model.heads_per_layer, positions=positions)
        if not head_masks:
            raise ConfigError("masks", masks, "give at least one mask")
        data, evaluated = self.evaluation(s, mode_object, chosen_metric, task_set)
        evaluator = evaluated.evaluator
        baseline = evaluator.baseline()
        counterpart = counterpart_baseline(s, chosen_metric, self.model, data, self.device)
        position_M = torch.tensor([positions.index(m.position) if m.position else -1 for m in head_masks])
        totals = evaluator.accumulate(masks_to_gates(head_masks, self.model.heads_per_layer), position_M=position_M)
        table = scan_table("evaluate", s.mode, head_masks, totals, baseline, chosen_metric, counterpart)
        return with_record(table.drop(columns="scan"), self.evaluation_record(data, planned, baseline["n_targets"]))

    def circuit_performance(
        self,
        scores: Rankings,
        mode: str | None = None,
        metric: Any = None,
        task: TaskSpec = None,
        resamples: int = 1000,
        level: float = 0.95,
        **settings: Any,
    ) -> pd.DataFrame:
        """MIB's circuit localization scores of edge rankings you bring (Mueller et al., ICML 2025): per ranking, one
        row of method, mode, cpr (area under the faithfulness curve, higher is better), cmd (area under |1 -
        faithfulness|, lower is better), their `level` percentile intervals over `resamples` resamples of the prompts
        (cpr_ci_low, cpr_ci_high, cmd_ci_low, cmd_ci_high; seeded by ablation.seed; resamples=0: none), the
        faithfulness of the top-n circuit (pruned to paths from the embeddings to the logits) at 0.1%, 0.2%, ...,
        100% of the model's edges (f_0.1% .. f_100%, each measured by the exact edge-patched forward) and those
        circuits' sizes after pruning (edges_0.1% ..), then how it was computed (headcount/circuits/cpr.py and
        bootstrap.py have the definitions). Writes nothing.

        scores: a list of edge names, most important first ("L0H3 -> L1H2.k", as the edge scans name them), or a
        mapping edge name -> score (ranked by |score|; an edge left out scores 0), or a mapping name -> either of
        those, one row per name. mode (one that corrupts every sender, as for edges), metric, task and settings as
        for evaluate."""
        s = self.mode_settings(mode, metric, **settings)
        if isinstance(self.model, EncoderDecoder):
            refuse_seq2seq_edges("circuit_performance")
        refuse_edges(self.model)
        planned = plan(validate_settings(s, self.task_settings(task)), lambda _: self.task(task), self.ablation_dir)
        ranked = checked_rankings(self.model, scores, s, resamples)
        data, evaluated = self.evaluation(s, planned.mode, planned.metric, planned.task)
        table, n_points = score_rankings(self.model, ranked, s, planned, evaluated, resamples, level)
        return with_record(table, self.evaluation_record(data, planned, n_points))

    def scan(
        self, name: str, mode: str | None = None, metric: Any = None, task: TaskSpec = None, **scan_settings: Any
    ) -> pd.DataFrame:
        """Run the scan `name` (a scan kind: `headcount-ablate --list` lists them) with the run's settings in `mode` and
        `metric`, on `task`, as headcount-ablate does: results go to <run>/ablation/ (a task's to
        ablation/tasks/<name>/) and summary.json, and a rerun with unchanged settings reads them back. A name the run's
        config lists keeps its settings there; scan_settings set the scan's own keys (top_k=6 for pairs,
        masks_file="masks.yaml" for custom, verify_top_k=20 for attribution). Returns the scan's table."""
        settings = self.mode_settings(mode, metric)
        settings.prune.export = False
        own = self.scan_settings.get(name)
        own = OmegaConf.to_container(OmegaConf.structured(own)) if own is not None else {"kind": name}
        # Typed here, so a key the kind does not take is one line naming the kind and what it takes.
        settings.scans = {name: typed_scan(name, OmegaConf.merge(OmegaConf.create(own), scan_settings))}
        config = self.config.copy()
        config.ablation = OmegaConf.structured(settings)
        config.trainer = OmegaConf.structured(TrainerConfig())  # this process alone, however the run trained
        task_cfg = self.task_settings(task)
        config.task = OmegaConf.structured(task_cfg if task_cfg is not None else TaskConfig())
        already_held = run_lock.holds(self.path)
        run_lock.acquire_if_writable(self.path, "headcount.load_run(...).scan")  # read-only storage: read back only
        try:
            session = AblationSession(config, self.path)
            return session.run_scans()[name]
        finally:
            if not already_held:
                run_lock.release(self.path)

    def seed_stability(
        self, kind: str, seeds: list[int], task: TaskSpec = None, n: int | None = None, **scan_args: Any
    ) -> tuple[pd.DataFrame, dict]:
        """How much the scan's top n heads (an edge_attribution scan: its top n edges, n its circuit_size by
        default) agree across seeds of the task generator (api_stability.py): the scan run on the task regenerated
        with each seed; a row per two seeds with their overlap, and a summary."""
        tasks = seed_tasks(self.task_settings(task), seeds)
        tables = {cfg.seed: self.scan(kind, task=cfg, **scan_args) for cfg in tasks}
        n = n if n is not None else circuit_size(kind, self.scan_settings.get(kind), scan_args)
        return seed_stability(tables, n)

    def results(
        self,
        scan: str,
        mode: str | None = None,
        metric: str | None = None,
        task: str | None = None,
        variant: str | None = None,
    ) -> pd.DataFrame:
        """The tables of a scan, stacked: of every mode and metric it has results in (their `mode` and `metric`
        columns tell them apart), or of one; on the run's data, or with task=<name> on that task's (its folder's
        name: ablation/tasks/<name>). A result no mode changes (head_scores) has one table and no mode column.
        variant: only the results of the scan's own variant (results_index's `variant`, "" for its default: top_heads
        ranked by single_head; "by_retrieval_scores" for rank_by=retrieval_scores)."""
        task = self.task_folder(task)
        index = self.results_index()
        rows = index[(index["scan"] == scan) & (index["task"] == (task or ""))]
        for column, wanted in (("mode", mode), ("metric", metric), ("variant", variant)):
            if wanted is not None:
                rows = rows[rows[column] == wanted]
        folder = ResultAddress(self.ablation_dir, task=task or "").folder
        paths = [folder / csv for csv in dict.fromkeys(rows["csv"]) if (folder / csv).exists()]
        if not paths:
            done = ", ".join(index["scan"].unique()) or "none"
            given = (("mode", mode), ("metric", metric), ("task", task), ("variant", variant))
            which = " ".join(f"{k}={v}" for k, v in given if v)
            raise ConfigError(
                "scan",
                scan,
                f"has no results{' with ' + which if which else ''} in {folder} (run.scan computes them; done: {done})",
            )
        return pd.concat([read_checked(path) for path in paths], ignore_index=True)

    def results_index(self) -> pd.DataFrame:
        """One row per scan result of the run: scan, kind, task ("" for the run's data), mode and metric (empty where
        neither changes it), variant (the scan's own setting that gave it files apart, top_heads' by_<rank_by>; ""
        at its default), rows, csv (the file's name in its folder)."""
        rows = []
        for folder in result_folders(self.ablation_dir):
            task, summary = folder.task, read_summary(folder.summary_path)
            sections = [
                (ResultAddress.of_section(self.ablation_dir, section, name, task).record(), section)
                for name, section in summary["modes"].items()
            ]
            sections.append(({"mode": "", "metric": "", "task": task}, summary.get("mode_independent", {})))
            for address, section in sections:
                for name, entry in section.get("scans", {}).items():
                    rows.append(
                        {
                            "scan": entry.get("scan", name),
                            "kind": entry["kind"],
                            "task": task,
                            "mode": address["mode"],
                            "metric": address["metric"],
                            "variant": ".".join(entry.get("variant", ())),
                            "rows": entry["rows"],
                            "csv": entry["files"][0],
                        }
                    )
        return pd.DataFrame(rows, columns=["scan", "kind", "task", "mode", "metric", "variant", "rows", "csv"])

    def summary(self, mode: str = "zero", metric: str = "loss", task: str | None = None) -> dict:
        """A section of summary.json: baseline, most important head, prunable fractions of one mode and metric, on the
        run's data or a task's (its folder's name)."""
        address = ResultAddress(self.ablation_dir, mode, metric, self.task_folder(task))
        return read_summary(address.summary_path).get("modes", {}).get(address.section, {})

    def task_folder(self, task: str | None) -> str:
        """The results folder a task names: its folder's name, or a prompts file's (its stem); "" for the run's data.
        ConfigError naming the folders there are when it has none."""
        if not task:
            return ""
        if Path(task).suffix.lower() in (".jsonl", ".json", ".csv", ".parquet"):
            task = task_name(TaskConfig(source="file", path=task))
        folders = [folder.task for folder in result_folders(self.ablation_dir) if folder.task]
        if task not in folders:
            raise ConfigError(
                "task",
                task,
                f"has no results folder in {self.ablation_dir / 'tasks'} (tasks with results: "
                f"{', '.join(folders) or 'none'}; run.scan(..., task=...) computes them)",
            )
        return task

    # --- helpers ----------------------------------------------------------------------------------------------

    def mode_settings(self, mode: str | None, metric: Any = None, **settings: Any) -> AblationConfig:
        """A copy of the run's ablation settings in `mode` and `metric` (default: the run's own), with other keys."""
        merged = OmegaConf.merge(OmegaConf.structured(self.settings), settings)
        s = typed_ablation(merged)
        if mode is not None and mode != s.mode:  # the run's own mode's keys stay with it (another mode refuses them)
            defaults = AblationConfig()
            for key in mode_setting_keys():
                if key not in settings:
                    setattr(s, key, getattr(defaults, key))
        if mode is not None:
            s.mode = mode
        if metric is not None:
            s.metric = metric
        return s

    def task_settings(self, task: TaskSpec) -> TaskConfig | None:
        """task as a TaskConfig: a source's name, a prompts file, a mapping of task.* keys; None: the run's own."""
        if task is None:
            return task_config(self.config)
        if isinstance(task, TaskConfig):
            return task
        if isinstance(task, str):
            if task in SOURCES and task != "file":
                task = {"source": task}
            elif Path(task).suffix.lower() in (".jsonl", ".json", ".csv", ".parquet"):
                task = {"source": "file", "path": task}
            else:
                raise ConfigError(
                    "task",
                    task,
                    f"a task source ({', '.join(n for n in SOURCES if n != 'file')}), a "
                    "prompts file (.jsonl, .json, .csv, .parquet) or a mapping of task.* keys",
                )
        unknown = sorted(set(dict(task)) - {f.name for f in dataclasses.fields(TaskConfig)})
        if unknown:  # was OmegaConf's multi-line "Key 'pth' not in 'TaskConfig'"
            allowed = ", ".join(f.name for f in dataclasses.fields(TaskConfig))
            raise ConfigError(f"task.{unknown[0]}", dict(task)[unknown[0]], f"no such task key; allowed: {allowed}")
        return typed(OmegaConf.create(dict(task)), TaskConfig)

    def evaluation_record(self, data: EvaluationSet, planned, n_targets: int) -> dict:
        """The columns that say how an evaluation was computed: metric, [task], split, n_eval, n_targets, reference."""
        reference = data.reference
        return {
            "metric": planned.metric.name,
            **({} if planned.task is None else {"task": planned.task.name}),
            "split": data.split,
            "n_eval": len(data.examples["input_ids"]),
            "n_targets": n_targets,
            "reference_split": None if reference is None else data.reference_split,
            "n_reference": None if reference is None else len(reference["input_ids"]),
        }

    def evaluation(self, s: AblationConfig, mode, metric, task: TaskSet | None) -> tuple[EvaluationSet, Evaluation]:
        """The evaluation set and evaluator for the settings, built once per mode, metric and task."""
        key = OmegaConf.to_yaml(OmegaConf.structured(s)) + repr(metric.describe()) + str(task and task.fingerprint())
        if key not in self._evaluations:
            data = evaluation_set(self.finished, s, mode, task)
            self._evaluations[key] = data, evaluation(s, mode, metric, self.model, data, None, self.device)
        return self._evaluations[key]


def load_run(run_dir: str | Path, device: str | None = None) -> Run:
    """The finished run in run_dir (the folder headcount-train wrote: .hydra/, checkpoints/, metrics.json; or a
    pretrained model's, made by headcount-ablate), its model in eval mode on `device` (default: the run's
    ablation.device, `auto`: CUDA when there is one)."""
    return Run(run_dir, device)


__all__ = ["Run", "load_run"]
