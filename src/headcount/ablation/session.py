"""run_ablations: every scan the ablation section lists, on one finished run, with results in <run>/ablation/.

A session opens the run once (headcount.run_dir.load_run), checks the settings and what they name against the model
before any work, builds the evaluation set (the run's data, or the task the config names, encoded for the model),
prepares the mode's replacements, the evaluator and the baseline, then runs the scans in the order given through
their kinds (ablation/scans/), and finally the structural export if asked. Scans that others need (single_head for
pairs' top_k and the single_head pruning order, pruning for a prunable-fraction export) run on demand under their
kind's name. Before any work, the data is checked against what the run trained on (ablation/data_check.py).
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

from headcount.ablation.checks import validate_settings
from headcount.ablation.data_check import checked_data
from headcount.ablation.encoder_checks import refuse_decoder_only
from headcount.ablation.engine.evaluation import counterpart_baseline, evaluation, evaluation_set, run_task, task_config
from headcount.ablation.engine.evaluator import MaskEvaluator
from headcount.ablation.engine.metrics import METRICS, resolve_metric
from headcount.ablation.export import check_export, export_pruned_model
from headcount.ablation.methods.importance import Importance, importance_under
from headcount.ablation.plan import plan
from headcount.ablation.precision import note_slow_precision
from headcount.ablation.records.address import ResultAddress
from headcount.ablation.records.distributed import scan_world
from headcount.ablation.records.results import ResultFiles, fingerprint, model_fingerprint
from headcount.ablation.records.summary import read_summary, record_default_metric, record_task_source
from headcount.ablation.scans import KINDS, Scan
from headcount.ablation.scans.base import ScanSettings, typed_scans
from headcount.captions import describe_run
from headcount.config import typed
from headcount.config.ablation import AblationConfig, ScanDtype
from headcount.config.task import TaskConfig
from headcount.config.train import TrainerConfig
from headcount.errors import ConfigError
from headcount.processes import console, set_first_process
from headcount.run_dir import RunPaths, load_run, read_pretrained


def run_ablations(cfg: DictConfig, run_dir: str | Path) -> list[Path]:
    """Run cfg.ablation's scans (and the pruned export, if asked) on the finished run in run_dir; cfg is a train
    config (model, data, seed, ablation, task). Returns the files written."""
    session = AblationSession(cfg, Path(run_dir))
    for scan in session.scans.values():
        scan.run()
    if session.settings.prune.export:
        export_pruned_model(session)
    return session.files.written


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
    eval batches, the replacements, the baseline, the result files, what scans have handed to others (`shared`), and
    the processes the scans' mask evaluations are shared out over (`world`: None for this process alone)."""

    def __init__(self, cfg: DictConfig, run_dir: Path):
        self.settings = s = typed_ablation(cfg.ablation)
        task_cfg = task_config(cfg)
        checked = validate_settings(s, task_cfg)  # before anything is read or written; plan() below goes on from here
        # The processes the trainer section asks for (one: none), before anything is read or written
        self.world = scan_world(typed(cfg.trainer, TrainerConfig), s.device) if "trainer" in cfg else None
        set_first_process(self.world is None or self.world.rank == 0)
        self.run = load_run(run_dir, cfg)
        self.device = resolve_device(s.device) if self.world is None else self.world.device
        note_slow_precision(s, self.device)  # a CPU that emulates the precision: said now, not after the first pass
        model_key = model_fingerprint(self.run.model)
        self.model = self.run.model.to(self.device, ScanDtype(s.dtype).torch).eval()
        self.heads_per_layer = self.model.heads_per_layer
        refuse_decoder_only(s, None if task_cfg is None else str(task_cfg.source), self.model.cfg.causal)
        planned = plan(checked, lambda c: run_task(cfg, self.model, c), RunPaths(run_dir).ablation)
        self.mode, self.metric, self.task, self.address = planned.mode, planned.metric, planned.task, planned.address
        self.positions = planned.positions
        self.section, self.out = self.address.section, self.address.folder
        if self.task is not None:
            check_task_folder(task_cfg, self.address, self.task.fingerprint()["tokens"])
        self.subject = describe_run(self.run.config, run_dir)
        if self.task is not None:
            self.subject += f", task {self.task.name}"
        # Everything a file or a head list can get wrong is checked before any work starts.
        self.scans = {name: self.new_scan(name, scan) for name, scan in s.scans.items()}
        for scan in self.scans.values():
            scan.prepare()
        check_export(s.prune, self.heads_per_layer)
        if self.task is None:
            data = checked_data(run_dir, self.run, s.allow_data_change)
        else:
            data = {"fingerprint": self.task.fingerprint()}

        eval_set = evaluation_set(self.run, s, self.mode, self.task)
        examples, reference = eval_set.examples, eval_set.reference
        n_eval = len(examples["input_ids"])
        settings_record = {
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
        self.key = fingerprint(model_key, data["fingerprint"], settings_record)
        eval_settings = {"split": eval_set.split, "n_eval": n_eval, **low_precision(s)}
        if eval_set.masked_lm is not None:  # what the points are depends on the masks
            eval_settings["masked_lm"] = eval_set.masked_lm
        self.eval_key = fingerprint(model_key, data["fingerprint"], eval_settings)
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
        self.counterpart = counterpart_baseline(s, self.metric, self.model, eval_set, self.device)
        self.record = {
            "mode": s.mode,
            "metric": self.metric.name,
            **({} if self.task is None else {"task": self.task.name}),
            "split": eval_set.split,
            "n_eval": n_eval,
            "n_targets": self.baseline["n_targets"],
            "reference_split": settings_record.get("reference_split"),
            "n_reference": settings_record.get("n_reference"),
            **low_precision(s),
            **({"patch_direction": str(s.patch_direction)} if self.mode.needs_task else {}),  # patching's direction
            **(
                {}
                if self.task is None
                else {"task_source": task_source(task_cfg), "task_fingerprint": data["fingerprint"]["tokens"]}
            ),
        }
        baselines = {f"baseline_{column}": self.baseline[column] for column in self.metric.columns}
        if self.task is not None:  # whether the model does the task at all, whatever the metric
            top1 = MaskEvaluator(self.model, self.batches, masks_per_pass=1, metric=METRICS["top1"]())
            baselines["task_top1"] = top1.baseline()["top1"]
        if self.counterpart is not None:
            baselines["counterpart"] = {column: self.counterpart[column] for column in self.metric.columns}
        self.files.open(
            {
                "model": model_key,
                "data": data,
                "settings": settings_record,
                **baselines,
                "n_targets": self.baseline["n_targets"],
                **({"pretrained": pretrained["provenance"]} if (pretrained := read_pretrained(run_dir)) else {}),
            }
        )
        if self.task is not None:
            record_default_metric(self.files.summary_path, resolve_metric(None, self.task.has_wrong, task=True).name)
            source = {"source": task_source(task_cfg), "tokens": data["fingerprint"]["tokens"]}
            record_task_source(self.files.summary_path, source)
        self.shared: dict[str, Any] = {}  # scan kind -> what its last run here handed to other scans

    def new_scan(self, name: str, cfg: ScanSettings) -> Scan:
        return KINDS[cfg.kind](name, cfg, self)

    def provided(self, kind: str, compute: bool = True) -> Any:
        """What a scan of this kind hands to others, from this session's run of it, else from its up-to-date
        results under its kind's name; failing both, runs it under that name, or with compute=False returns None."""
        if kind not in self.shared:
            scan = self.new_scan(kind, KINDS[kind].Settings(kind=kind))
            if compute or scan.read_back(announce=False) is not None:
                scan.prepare()  # its checks against the model and task, as for a scan the settings name
                scan.run()
        return self.shared.get(kind)

    def importance(self, mask_LH: Tensor, per_example: bool = False) -> Importance:
        """Gradient importance of the metric at gates mask_LH, on the eval batches, under this session's
        replacements; per batch (headcount's form) or per example (Michel et al.'s)."""
        s = self.settings
        return importance_under(
            self.model, self.batches, self.replacements, s.normalize_importance, mask_LH, self.metric, per_example
        )

    def layer_head_tensor(self, table: pd.DataFrame, column: str) -> Tensor:
        """(L, H) float64 from a table's layer, head and `column`; 0 where a head has no row."""
        values_LH = torch.zeros(self.model.n_layers, self.model.max_heads, dtype=torch.float64)
        values_LH[table["layer"].tolist(), table["head"].tolist()] = torch.tensor(table[column].tolist()).double()
        return values_LH
