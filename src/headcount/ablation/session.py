"""run_ablations: every scan the ablation section lists, on one finished run, with results in <run>/ablation/.

A session opens the run once (headcount.run_dir.load_run), checks the settings and what they name against the model
before any work, builds the evaluation set (the run's data, or the task the config names, encoded for the model),
prepares the mode's replacements, the evaluator and the baseline, then runs the scans in the order given through
their kinds (ablation/scans/), each after the scans it declares it needs (`Scan.needs`: single_head for pairs' top_k
and the single_head pruning order, a ranking for top-k heads, pruning for a prunable-fraction export; a needed scan
the list lacks is added under its kind's name), and finally the structural export if asked. Before any work, the
data is checked against what the run trained on (ablation/data_check.py).
Every result carries a fingerprint of what it depends on (the model's weights, the data's or the task's content, the
ablation settings, the masks): a scan whose CSV is up to date is read back rather than rerun, and an interrupted one
resumes from its partial file. Each mode and metric keeps its own files and its own section of summary.json
(ablation/records/results.py); a task keeps its own folder, ablation/tasks/<task name>/.
"""

import math
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from omegaconf import DictConfig, OmegaConf
from rich.markup import escape
from torch import Tensor

from headcount.ablation.checks import CheckedSettings, validate_settings
from headcount.ablation.data_check import checked_data
from headcount.ablation.encoder_checks import refuse_decoder_only
from headcount.ablation.engine.evaluation import (
    EvaluationSet,
    counterpart_sums,
    evaluation,
    evaluation_set,
    plain_evaluator,
    run_task,
    task_config,
)
from headcount.ablation.engine.metrics import METRICS, resolve_metric
from headcount.ablation.export import check_export, export_needs, export_pruned_model
from headcount.ablation.methods.importance import Importance, importance_under
from headcount.ablation.plan import plan
from headcount.ablation.precision import note_slow_precision
from headcount.ablation.records.address import ResultAddress
from headcount.ablation.records.distributed import scan_world
from headcount.ablation.records.results import ResultFiles, fingerprint, model_fingerprint
from headcount.ablation.records.summary import read_summary, record_default_metric, record_task_source
from headcount.ablation.scans import KINDS, Scan
from headcount.ablation.scans.base import ScanSettings, typed_scans
from headcount.ablation.scans.edge_attribution import EdgeAttributionScan
from headcount.ablation.scans.mask_scan import MaskScan
from headcount.ablation.seq2seq_checks import refuse_one_stack_only
from headcount.ablation.task_seeds import seed_stability, seeded_task, stability_figure
from headcount.captions import describe_run
from headcount.config import typed
from headcount.config.ablation import AblationConfig, ScanDtype
from headcount.config.task import TaskConfig
from headcount.config.train import TrainerConfig
from headcount.errors import ConfigError
from headcount.io import atomic_write_text
from headcount.model.encoder_decoder import EncoderDecoder
from headcount.processes import console, set_first_process
from headcount.run_dir import RunPaths, load_run, read_pretrained


def run_ablations(cfg: DictConfig, run_dir: str | Path) -> list[Path]:
    """Run cfg.ablation's scans (and the pruned export, if asked) on the finished run in run_dir; cfg is a train
    config (model, data, seed, ablation, task). Returns the files written."""
    session = AblationSession(cfg, Path(run_dir))
    session.run_scans()
    if session.settings.prune.export:
        export_pruned_model(session)
    if session.settings.task_seeds is not None:
        compare_task_seeds(session, cfg, Path(run_dir))
    return session.files.written


def compare_task_seeds(session: "AblationSession", cfg: DictConfig, run_dir: Path) -> None:
    """ablation.task_seeds: every scan of the session run again on the task drawn with each seed (each seed's
    session in its own folder <task>_seed<s>), and each mask scan's top heads and each edge_attribution scan's top
    circuit_size edges compared across the seeds (ablation/task_seeds.py), written beside the scan's table in the
    base task's folder."""
    tables: dict[int, dict[str, pd.DataFrame]] = {}
    for seed in session.settings.task_seeds:
        seeded = cfg.copy()
        seeded.task = OmegaConf.structured(seeded_task(session.task_cfg, seed))
        seeded.ablation.task_seeds = None
        seed_session = AblationSession(seeded, run_dir)
        tables[seed] = seed_session.run_scans()
        session.files.written.extend(p for p in seed_session.files.written if p not in session.files.written)
    for scan in session.order:
        if not isinstance(scan, (MaskScan, EdgeAttributionScan)):
            continue
        by_seed = {seed: by_name[scan.name] for seed, by_name in tables.items()}
        # an edge scan's circuit: its circuit_size edges (none: nothing to compare)
        n = min(scan.cfg.circuit_size, *map(len, by_seed.values())) if isinstance(scan, EdgeAttributionScan) else None
        if n == 0:
            continue
        pairs, summary = seed_stability(by_seed, n)
        csv = scan.path(".csv", "_seed_stability")
        atomic_write_text(csv, pairs.to_csv(index=False))  # by the first process of a distributed scan only
        items = "edges" if isinstance(scan, EdgeAttributionScan) else "heads"
        title = scan.title(f"overlap of the top {summary['n']} {items} by {summary['by']} across task seeds")
        figure = stability_figure(pairs, summary, scan.path(".png", "_seed_stability"), title)
        session.files.note_written(csv)
        session.files.note_written(figure)
        session.files.update_summary({"seed_stability": {scan.name: summary}})


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def task_source(cfg: TaskConfig) -> str:
    """Where a task's prompts come from, for its tables: a file's absolute path, a Hub dataset, or a generator."""
    if cfg.path is not None:
        return str(Path(cfg.path).resolve())
    return f"hub:{cfg.hub_name}" if cfg.hub_name is not None else str(cfg.source)


def check_task_folder(cfg: TaskConfig, address: ResultAddress, tokens: str) -> None:
    """ConfigError when the task's results folder holds another source's results (a prompts file of the same stem
    in another folder, other prompts): they would be replaced. The same prompts moved elsewhere are the same task;
    task.name gives a task its own folder.

    A folder written before task folders recorded their source is adopted (the session records this task's source)
    when its results are of these prompts (a section's recorded prompt tokens are these), or when it holds none; with
    only other prompts' results, whose source is unknown, it is refused: they might be another file's."""
    summary = read_summary(address.summary_path)
    key, value = ("task.name", cfg.name) if cfg.name else ("task.path", cfg.path or cfg.source)
    recorded = summary.get("task_source") or {}
    if recorded and recorded["source"] != task_source(cfg) and recorded["tokens"] != tokens:
        raise ConfigError(
            key,
            value,
            f"its results folder ablation/tasks/{address.task}/ holds the results of {recorded['source']}: give this "
            "task a folder of its own with task.name=<name>",
        )
    if recorded:
        return
    sections = summary["modes"].values()
    prompts = {section.get("data", {}).get("fingerprint", {}).get("tokens") for section in sections} - {None}
    if prompts and tokens not in prompts:
        raise ConfigError(
            key,
            value,
            f"its results folder ablation/tasks/{address.task}/ holds results of other prompts, written before task "
            "folders recorded their source (so whose is not known): give this task a folder of its own with "
            "task.name=<name>, or delete that folder to replace them",
        )
    if prompts:
        console().print(
            f"[yellow]note:[/yellow] ablation/tasks/{address.task}/ recorded no source (written before task folders "
            f"did); its results are of these prompts, so it records their source now: {escape(task_source(cfg))}",
            highlight=False,
            soft_wrap=True,
        )


def typed_ablation(section: DictConfig) -> AblationConfig:
    """The ablation section typed: its own keys by AblationConfig, each scan's by its kind's settings (a key the kind
    does not take: one-line ConfigError)."""
    settings = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(AblationConfig), section))
    settings.scans = typed_scans(settings.scans)
    return settings


def low_precision(s: AblationConfig) -> dict:
    """What results record of ablation.dtype: nothing for float32 (earlier results stay up to date), else the dtype."""
    return {} if s.dtype == ScanDtype.float32 else {"dtype": ScanDtype(s.dtype).value}


def refuse_overflow(s: AblationConfig, baseline: float) -> None:
    """A low-precision model whose activations overflow (Gemma's do in float16) gives no numbers: one line, no table."""
    if s.dtype != ScanDtype.float32 and not math.isfinite(baseline):
        raise ConfigError(
            "ablation.dtype",
            ScanDtype(s.dtype).value,
            f"the model's baseline is {baseline} in this precision (its activations overflow it): use bfloat16 or "
            "float32",
        )


class AblationSession:
    """What every scan of one run shares: the settings, the mode and the metric, the model and its evaluator on the
    eval batches, the replacements, the baseline, the result files, what scans have handed to the scans that declared
    they need them (`provided`), and the processes the scans' mask evaluations are shared out over (`world`: None for
    this process alone).

    Setting up is a sequence of named steps, each the one place its part is done: check the settings, open the run,
    plan the results, check the scans (and add the scans they need), fingerprint the data, evaluate the baselines,
    open the result files. `order` is then every scan after the scans it needs (`Scan.needs`)."""

    def __init__(self, cfg: DictConfig, run_dir: Path):
        self.settings, self.task_cfg = typed_ablation(cfg.ablation), task_config(cfg)
        checked = validate_settings(self.settings, self.task_cfg)  # before anything is read or written
        self.open_run(cfg, run_dir)
        self.plan_results(cfg, checked, run_dir)
        self.check_scans()  # everything a file or a head list can get wrong, before any work starts
        data = self.data_fingerprint(run_dir)
        eval_set = evaluation_set(self.run, self.settings, self.mode, self.task)
        self.evaluate_baselines(eval_set, data)
        self.open_results(eval_set, data, run_dir)

    # --- the steps of setting up, in order ------------------------------------------------------------------------

    def open_run(self, cfg: DictConfig, run_dir: Path) -> None:
        """The processes the trainer section asks for (one: none), then the finished run, its model on the device in
        the scan's precision, and the fingerprint of its weights (taken in float32, before the precision changes)."""
        s = self.settings
        self.world = scan_world(typed(cfg.trainer, TrainerConfig), s.device) if "trainer" in cfg else None
        set_first_process(self.world is None or self.world.rank == 0)
        self.run = load_run(run_dir, cfg)
        self.device = resolve_device(s.device) if self.world is None else self.world.device
        note_slow_precision(s, self.device)  # a CPU that emulates the precision: said now, not after the first pass
        self.model_key = model_fingerprint(self.run.model)
        self.model = self.run.model.to(self.device, ScanDtype(s.dtype).torch).eval()
        self.heads_per_layer = self.model.heads_per_layer
        source = None if self.task_cfg is None else str(self.task_cfg.source)
        refuse_decoder_only(s, source, self.model.cfg.causal, isinstance(self.model, EncoderDecoder))
        if isinstance(self.model, EncoderDecoder):
            refuse_one_stack_only(s, source)

    def plan_results(self, cfg: DictConfig, checked: CheckedSettings, run_dir: Path) -> None:
        """The task, the metric, the mode against the task and the results' address (ablation/plan.py), the task's
        folder checked against its source, and the subject figures name."""
        planned = plan(checked, lambda c: run_task(cfg, self.model, c), RunPaths(run_dir).ablation)
        self.mode, self.metric, self.task, self.address = planned.mode, planned.metric, planned.task, planned.address
        self.positions = planned.positions
        if self.task is not None:
            check_task_folder(self.task_cfg, self.address, self.task.fingerprint()["tokens"])
        self.subject = describe_run(self.run.config, run_dir)
        if self.task is not None:
            self.subject += f", task {self.task.name}"

    def check_scans(self) -> None:
        """The listed scans, each checked against the model (`prepare`), with the scans they need added under their
        kinds' names where the list has none of that name; `order` runs each after what it needs. Then the export's
        settings."""
        self.handed: dict[str, Any] = {}  # a needed scan's kind (or name) -> what its run handed to the others
        self.scans = {name: self.new_scan(name, scan) for name, scan in self.settings.scans.items()}
        self.order: list[Scan] = []
        for scan in list(self.scans.values()):
            self.place(scan, ())
        for need in export_needs(self.settings.prune):
            self.place(self.needed(need, "ablation.prune"), ())
        for scan in self.scans.values():  # the listed scans first, then those added: a listed scan's error comes first
            scan.prepare()
        check_export(self.settings.prune, self.heads_per_layer)

    def data_fingerprint(self, run_dir: Path) -> dict:
        """What the results depend on of the data: the run's splits (checked against what it trained on), or the
        task's prompts."""
        if self.task is None:
            return checked_data(run_dir, self.run, self.settings.allow_data_change)
        return {"fingerprint": self.task.fingerprint()}

    def evaluate_baselines(self, eval_set: EvaluationSet, data: dict) -> None:
        """The fingerprints every result depends on, the mode's replacements, the evaluator on the eval batches, and
        the unmasked model's metric (and its counterpart's, the gap's other end); a baseline that is not finite is
        refused before summary.json records it."""
        s = self.settings
        examples, reference = eval_set.examples, eval_set.reference
        n_eval = len(examples["input_ids"])
        self.settings_record = {
            "mode": s.mode,
            "split": eval_set.split,
            "n_eval": n_eval,
            **({} if reference is None else {"reference_split": eval_set.reference_split}),
            **({} if reference is None else {"n_reference": len(reference["input_ids"])}),
            **self.mode.settings(s),
            **({"metric": self.metric.describe()} if self.metric.named_in_results else {}),
            **({} if self.task is None else {"task": self.task.name}),
            **({"patch_positions": "each"} if s.patch_positions == "each" else {}),
            **low_precision(s),
            **({} if eval_set.masked_lm is None else {"masked_lm": eval_set.masked_lm}),
        }
        self.key = fingerprint(self.model_key, data["fingerprint"], self.settings_record)
        eval_settings = {"split": eval_set.split, "n_eval": n_eval, **low_precision(s)}
        if eval_set.masked_lm is not None:  # what the points are depends on the masks
            eval_settings["masked_lm"] = eval_set.masked_lm
        self.eval_key = fingerprint(self.model_key, data["fingerprint"], eval_settings)
        self.files = ResultFiles(self.address, self.key)
        evaluated = evaluation(s, self.mode, self.metric, self.model, eval_set, self.files, self.device)
        self.replacements, self.batches, self.evaluator = evaluated.replacements, evaluated.batches, evaluated.evaluator
        self.baseline = self.evaluator.baseline()
        refuse_overflow(s, self.baseline[self.metric.columns[0]])
        if not math.isfinite(self.baseline[self.metric.primary]):  # before summary.json records it
            raise ConfigError(
                "ablation.metric",
                self.metric.name,
                f"is {self.baseline[self.metric.primary]} on the unablated model: nothing was written",
            )
        self.counterpart_sums = counterpart_sums(s, self.metric, self.model, eval_set, self.device)
        self.counterpart = None if self.counterpart_sums is None else self.counterpart_sums.baseline

    def open_results(self, eval_set: EvaluationSet, data: dict, run_dir: Path) -> None:
        """The constant columns every table ends with (`record`), and the results' section of summary.json opened
        with the model, the data, the settings and the baselines (a task's folder records its default metric and its
        source)."""
        s, settings_record = self.settings, self.settings_record
        self.record = {
            "mode": s.mode,
            "metric": self.metric.name,
            **({} if self.task is None else {"task": self.task.name}),
            "split": eval_set.split,
            "n_eval": settings_record["n_eval"],
            "n_targets": self.baseline["n_targets"],
            "reference_split": settings_record.get("reference_split"),
            "n_reference": settings_record.get("n_reference"),
            **low_precision(s),
            **({"patch_direction": str(s.patch_direction)} if self.mode.needs_task else {}),  # patching's direction
            **(
                {}
                if self.task is None
                else {"task_source": task_source(self.task_cfg), "task_fingerprint": data["fingerprint"]["tokens"]}
            ),
        }
        baselines = {f"baseline_{column}": self.baseline[column] for column in self.metric.columns}
        if self.task is not None:  # whether the model does the task at all, whatever the metric
            top1 = plain_evaluator(self.model, self.batches, METRICS["top1"]())
            baselines["task_top1"] = top1.baseline()["top1"]
        if self.counterpart is not None:
            baselines["counterpart"] = {column: self.counterpart[column] for column in self.metric.columns}
        self.files.open(
            {
                "model": self.model_key,
                "data": data,
                "settings": settings_record,
                **baselines,
                "n_targets": self.baseline["n_targets"],
                **({"pretrained": pretrained["provenance"]} if (pretrained := read_pretrained(run_dir)) else {}),
            }
        )
        if self.task is not None:
            record_default_metric(self.files.summary_path, resolve_metric(None, self.task.has_wrong, task=True).name)
            source = {"source": task_source(self.task_cfg), "tokens": data["fingerprint"]["tokens"]}
            record_task_source(self.files.summary_path, source)

    # --- the scans and what they need ----------------------------------------------------------------------------

    def new_scan(self, name: str, cfg: ScanSettings) -> Scan:
        return KINDS[cfg.kind](name, cfg, self)

    def place(self, scan: Scan, chain: tuple[str, ...]) -> None:
        """`scan` into `order`, after every scan it needs (placed first, recursively)."""
        if scan in self.order:
            return
        if scan.name in chain:
            path = " -> ".join([*chain, scan.name])
            raise ConfigError(f"ablation.scans.{chain[0]}", path, "the scans need each other in a circle")
        for need in scan.needs():
            self.place(self.needed(need, f"ablation.scans.{scan.name}"), (*chain, scan.name))
        self.order.append(scan)

    def needed(self, need: str, key: str) -> Scan:
        """The scan that provides `need`: a scan of that kind already placed (its last run is what others read, as it
        was when each ran in turn), else the listed scan of that name, else a new one of that kind under its name,
        with the kind's default settings."""
        placed = [scan for scan in self.order if scan.kind == need]
        if placed:
            return placed[-1]
        if need in self.scans:
            return self.scans[need]
        scan = self.scans[need] = self.new_scan(need, KINDS.get(need, key).Settings(kind=need))
        return scan

    def run_scans(self) -> dict[str, pd.DataFrame]:
        """Every scan in `order` (each after what it needs): its table by name."""
        return {scan.name: scan.run() for scan in self.order}

    def hand(self, name: str, value: Any) -> None:
        """What a scan's result hands to the scans that need it (its kind's, or a ranking scan's own name)."""
        self.handed[name] = value

    def provided(self, kind: str, compute: bool = True) -> Any:
        """What the scan `kind` (a kind, or a ranking scan's name) handed to the scans that need it, from its run in
        this session: a scan reads only what it declared it needs (`Scan.needs`), which the session ran first. With
        compute=False, what it may read without needing it: this session's run, else an up-to-date result read back
        under its kind's name, else None (nothing is computed)."""
        if kind in self.handed:
            return self.handed[kind]
        if compute:
            raise RuntimeError(f"{kind}'s result was read by a scan that did not declare it needs it (Scan.needs)")
        scan = self.new_scan(kind, KINDS[kind].Settings(kind=kind))
        if scan.read_back(announce=False) is not None:
            scan.prepare()
            scan.run()
        return self.handed.get(kind)

    def importance(self, mask_LH: Tensor, per_example: bool = False) -> Importance:
        """Gradient importance of the metric at gates mask_LH, on the eval batches, under this session's
        replacements; per batch (headcount's form) or per example (Michel et al.'s)."""
        s = self.settings
        return importance_under(
            self.model, self.batches, self.replacements, s.normalize_importance, mask_LH, self.metric, per_example
        )

    def layer_head_tensor(self, table: pd.DataFrame, column: str) -> Tensor:
        """(L, H) float64 from a table's layer, head and `column`; 0 where a head has no row. On an encoder-decoder
        (L, H) is its head grid, and a row's kind and layer say its grid row."""
        grid = self.heads_per_layer
        values_LH = torch.zeros(len(grid), max(grid), dtype=torch.float64)
        rows = table["layer"].tolist()
        if "kind" in table:
            rows = [grid.row(kind, layer) for kind, layer in zip(table["kind"], rows)]
        values_LH[rows, table["head"].tolist()] = torch.tensor(table[column].tolist()).double()
        return values_LH
