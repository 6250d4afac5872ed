"""Where a result lives: one small type, the only place a result's folder, file names and summary.json section are
derived. A session writes its address into its section of summary.json (`"address"`), and every reader (the Python
API, findings, reports, W&B, resume) reads it back instead of rebuilding it from strings.

    run + task       -> folder   <run>/ablation/ (the run's data) or <run>/ablation/tasks/<task>/
    mode + metric    -> section  "zero", "patch.logit_diff" (the mode alone for loss)
    section + scan   -> files    single_head.csv (zero, loss), single_head.mean.csv, single_head.patch.logit_diff.csv

Zero ablation measured by loss keeps the plain names, as results were named before other modes and metrics; results
no mode changes (head_scores) keep plain names too. A setting that changes a result and names its files apart
(patch_direction=denoise, patch_positions=each, a dtype other than float32) is one entry of the address's `variant`,
which ablation/plan.py fills: single_head.patch.logit_diff.denoise.csv beside single_head.patch.logit_diff.csv,
single_head.zero.bfloat16.csv beside single_head.csv. A setting of one scan that changes
its result (top_heads' rank_by) is that scan's own variant (its kind's `variant`), after the section in its file names
and in the name of its summary.json entry: top_heads.zero.by_retrieval_scores.csv beside top_heads.csv.
"""

from dataclasses import dataclass, replace
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from headcount.run_dir import RunPaths

PLAIN_SECTION = "zero"  # the section whose files carry no tag
PLAIN_METRIC = "loss"  # the metric a section's name leaves out
PLAIN_DTYPE = "float32"  # the precision whose results carry no dtype in their address
LOW_PRECISIONS = ("bfloat16", "float16")  # the others (config/ablation.py ScanDtype)


@dataclass(frozen=True)
class ResultAddress:
    """The results of one (run, task, mode, metric): `ablation_dir` is the run's <run>/ablation/, `task` the task's
    folder name ("" for the run's own data)."""

    ablation_dir: Path
    mode: str = "zero"
    metric: str = PLAIN_METRIC
    task: str = ""
    variant: tuple[str, ...] = ()  # settings beyond mode and metric that give results their own files (plan.py)

    @property
    def qualifiers(self) -> tuple[str, ...]:
        """What tells these results apart from others of the same scan in the same folder, in the order file names
        carry it: the mode, the metric unless it is loss, then the variant."""
        return (self.mode, *((self.metric,) if self.names_metric else ()), *self.variant)

    @property
    def precision(self) -> tuple[str, ...]:
        """The variant's dtype, where the results are not float32's: a result no mode changes (head_scores) still
        carries it (head_scores.bfloat16.csv)."""
        return tuple(v for v in self.variant if v in LOW_PRECISIONS)

    @property
    def names_metric(self) -> bool:
        """Whether the results name their metric: all but loss, the metric results had before the others."""
        return self.metric != PLAIN_METRIC

    @property
    def section(self) -> str:
        """The section of summary.json, and the tag in file names."""
        return ".".join(self.qualifiers)

    @property
    def folder(self) -> Path:
        return self.ablation_dir / "tasks" / self.task if self.task else self.ablation_dir

    @property
    def summary_path(self) -> Path:
        from headcount.ablation.records.summary import summary_in

        return summary_in(self.folder)

    def file(self, stem: str, ext: str, mode_independent: bool = False, scan_variant: tuple[str, ...] = ()) -> Path:
        """<folder>/<stem><tag><ext>: single_head.csv, single_head.mean.csv, single_head.mean.partial.csv; a
        mode-independent result's file carries no section. A scan's own variant (`scan_variant`: a setting of that
        scan alone that changes its result, top_heads' rank_by) follows the section: top_heads.zero.by_direct_effect
        .csv beside top_heads.csv."""
        parts = (*(() if mode_independent else self.qualifiers), *scan_variant)
        tag = "" if parts in ((), (PLAIN_SECTION,)) else "." + ".".join(parts)
        return self.folder / f"{stem}{tag}{ext}"

    @staticmethod
    def entry_name(scan: str, scan_variant: tuple[str, ...] = ()) -> str:
        """A scan's entry in its section of summary.json: its name, and its variant when it has one, so that the
        results of two variants keep two records (top_heads, top_heads.by_direct_effect)."""
        return ".".join((scan, *scan_variant))

    def replacements_file(self) -> Path:
        """Where the mode keeps the replacements it prepared (means, a resampling), reused by later sessions."""
        return self.folder / f"replacements_{self.mode}.pt"

    def with_task(self, task: str) -> "ResultAddress":
        return replace(self, task=task)

    def record(self) -> dict[str, str]:
        """What summary.json's section records about its own address (read back by `from_record`)."""
        return {
            "mode": self.mode,
            "metric": self.metric,
            "task": self.task,
            **({"variant": self.variant} if self.variant else {}),
        }

    @classmethod
    def from_record(cls, ablation_dir: Path, record: dict) -> "ResultAddress":
        variant = tuple(record.get("variant", ()))
        return cls(Path(ablation_dir), record["mode"], record["metric"], record.get("task", ""), variant)

    @classmethod
    def from_section(cls, ablation_dir: Path, section: str, task: str = "") -> "ResultAddress":
        """The address of a summary.json section that does not record its own (written before addresses were)."""
        mode, _, metric = section.partition(".")
        return cls(Path(ablation_dir), mode, metric or PLAIN_METRIC, task)

    @classmethod
    def of_section(cls, ablation_dir: Path, section: dict, name: str, task: str = "") -> "ResultAddress":
        """The address a section of summary.json records, or that its name gives (older summaries)."""
        if "address" in section:
            return cls.from_record(ablation_dir, section["address"])
        return cls.from_section(ablation_dir, name, task)


def metric_name(spec) -> str:
    """The name of the metric ablation.metric gives (None: loss; a mapping: its name or its function's)."""
    if spec is None:
        return PLAIN_METRIC
    if hasattr(spec, "keys"):
        return str(spec.get("name") or str(spec["_target_"]).rsplit(".", 1)[-1])
    return str(spec)


def variant_of(mode: str, patch_direction: str, patch_positions: str, dtype: str = PLAIN_DTYPE) -> tuple[str, ...]:
    """The settings that give results their own files beyond mode and metric (single_head.patch.logit_diff.denoise.
    csv; a low precision's single_head.zero.bfloat16.csv beside float32's single_head.csv, so that a precision
    comparison keeps both): their defaults name nothing, so every address made before variants stays as it was."""
    dtype = getattr(dtype, "value", dtype)  # a ScanDtype choice or its name
    return (
        *(("denoise",) if str(mode) == "patch" and str(patch_direction) == "denoise" else ()),
        *(("each",) if str(patch_positions) == "each" else ()),
        *((str(dtype),) if str(dtype) != PLAIN_DTYPE else ()),
    )


def run_address(run_dir: str | Path, config: DictConfig | None = None) -> ResultAddress:
    """The address of the results a run's own config asks for (its ablation mode and metric, on its task or its
    data): what its report, its finding and its W&B headline read. The mode and metric are the config's, with the
    defaults the session itself takes (config/ablation.py); a task's default metric is the one its folder's
    summary.json recorded."""
    from headcount.ablation.records.summary import read_summary
    from headcount.config import typed
    from headcount.config.ablation import AblationConfig

    paths = RunPaths(Path(run_dir))
    if config is None:
        config = OmegaConf.load(paths.config) if paths.config.exists() else OmegaConf.create({})
    defaults = AblationConfig()
    mode = str(OmegaConf.select(config, "ablation.mode", default=defaults.mode))
    spec = OmegaConf.select(config, "ablation.metric", default=defaults.metric)
    variant = variant_of(
        mode,
        OmegaConf.select(config, "ablation.patch_direction", default=defaults.patch_direction),
        OmegaConf.select(config, "ablation.patch_positions", default=defaults.patch_positions),
        OmegaConf.select(config, "ablation.dtype", default=defaults.dtype),
    )
    if OmegaConf.select(config, "task.source", default=None) is None:
        return ResultAddress(paths.ablation, mode, metric_name(spec), variant=variant)
    from headcount.config.task import TaskConfig
    from headcount.tasks import task_name  # tasks load their sources only when a run has one

    address = ResultAddress(paths.ablation, mode, metric_name(spec), task_name(typed(config.task, TaskConfig)), variant)
    if spec is None:
        address = replace(address, metric=read_summary(address.summary_path).get("default_metric", PLAIN_METRIC))
    return address


def result_folders(ablation_dir: Path) -> list[ResultAddress]:
    """The address of every folder of a run's results (its folder and summary_path; no mode): the run's data's,
    <run>/ablation, then each task's, <run>/ablation/tasks/<task>."""
    ablation_dir = Path(ablation_dir)
    tasks = ResultAddress(ablation_dir, task="_").folder.parent
    names = sorted(f.name for f in tasks.iterdir() if f.is_dir()) if tasks.is_dir() else []
    return [ResultAddress(ablation_dir, task=name) for name in ["", *names]]
