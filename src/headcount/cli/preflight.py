"""Everything headcount-train checks before the first training step, so that a mistake costs seconds, not a training
run (in a sweep: before the first job, see cli/sweep.py).

`validate_job` checks one job's config: keys the schema lacks, each section and the checks across sections
(config/), the data section as the data layer checks it (and a text source's files), the model as it would be built
(on PyTorch's meta device: shapes without memory) and whether training it can fit in this machine's memory, the
ablation section with every listed scan's checks, including those against the model's heads, and the finding.
"""

import os
from pathlib import Path

import torch
from omegaconf import DictConfig

from headcount.ablation.checks import validate_settings
from headcount.ablation.encoder_checks import refuse_decoder_only
from headcount.ablation.engine.evaluation import run_task, task_config
from headcount.ablation.export import check_export
from headcount.ablation.plan import AblationPlan, plan
from headcount.ablation.records.distributed import check_scan_trainer
from headcount.ablation.scans import KINDS
from headcount.ablation.seq2seq_checks import refuse_one_stack_only
from headcount.ablation.session import typed_ablation
from headcount.config import typed, validate_train_config
from headcount.config.ablation import AblationConfig, unselected_scans_dropped
from headcount.config.data import DataConfig
from headcount.config.model import ModelConfig
from headcount.config.train import TrainerConfig
from headcount.data import validate_data_config
from headcount.data.essays import essay_files
from headcount.data.text import text_files
from headcount.errors import ConfigError
from headcount.findings import validate_finding
from headcount.model.encoder_decoder import EncoderDecoder, build_model
from headcount.model.transformer import Transformer
from headcount.pretrained.run_config import resolve_pretrained

# Bytes a parameter takes while it trains: its value, its gradient and Adam's two moments, in the weights' precision
# (mixed precision keeps float32 weights). Activations come on top; this is the floor.
VALUES_PER_PARAM = 4
BYTES_PER_VALUE = {"64-true": 8, "bf16-true": 2}
DEFAULT_MODEL = ModelConfig()


def validate_job(cfg: DictConfig) -> None:
    """Everything about one job's config that can fail before training; raises ConfigError. With model.pretrained,
    the model checked is the one the checkpoint implies (its config is read, not its weights)."""
    unselected_scans_dropped(cfg)
    cfg = resolve_pretrained(cfg)
    validate_train_config(cfg)
    check_precision_runs_here(cfg.trainer)
    data: DataConfig = typed(cfg.data, DataConfig)
    validate_data_config(data)
    if data.source == "text":
        text_files(data)
    if data.source == "essays":
        essay_files()  # the wheel installed, before anything is written
    model = model_on_meta(typed(cfg.model, ModelConfig), cfg.trainer)
    check_fits_in_memory(model, cfg.trainer)
    if cfg.ablation.scans:
        settings = typed_ablation(cfg.ablation)
        check_ablation(settings, model, cfg)
        check_scan_trainer(typed(cfg.trainer, TrainerConfig), settings.device)  # the scans run on the same processes
    validate_finding(cfg.finding)


def largest_dimension(cfg: ModelConfig) -> tuple[str, int]:
    """The model key that most exceeds the default model's: the one to name when the model is too large."""
    sizes = [
        ("model.d_model", cfg.d_model, DEFAULT_MODEL.d_model),
        ("model.n_layers", cfg.n_layers, DEFAULT_MODEL.n_layers),
        ("model.vocab_size", cfg.vocab_size, DEFAULT_MODEL.vocab_size),
        ("model.n_ctx", cfg.n_ctx, DEFAULT_MODEL.n_ctx),
        ("model.attn.n_heads", cfg.attn.n_heads, DEFAULT_MODEL.attn.n_heads),
        ("model.attn.head_dim", cfg.attn.head_dim or 0, DEFAULT_MODEL.d_model // DEFAULT_MODEL.attn.n_heads),
        ("model.mlp_ratio", cfg.mlp_ratio if cfg.mlp else 0, DEFAULT_MODEL.mlp_ratio),
    ]
    key, value, _ = max(sizes, key=lambda size: size[1] / size[2])
    return key, value


def model_on_meta(cfg: ModelConfig, trainer: DictConfig) -> Transformer | EncoderDecoder:
    """The model as training would build it, on the meta device: every shape and check, no memory."""
    try:
        with torch.device("meta"):
            return build_model(cfg)
    except RuntimeError as error:
        if "overflow" not in str(error):  # a bug, not a size: let it show as one
            raise
        # one weight matrix has more bytes than PyTorch can count (2^63)
        key, value = largest_dimension(cfg)
        available, kind = training_memory(trainer)
        raise ConfigError(
            key,
            value,
            f"the model needs more than {gib(2**63)} (one weight matrix alone), more than this machine's "
            f"{gib(available)} of {kind}",
        ) from None


def training_memory(trainer: DictConfig) -> tuple[int, str]:
    """The memory one training process has: the smallest GPU's when it trains on GPUs, else the machine's RAM."""
    if on_gpu(trainer) and torch.cuda.is_available():
        sizes = [torch.cuda.get_device_properties(i).total_memory for i in range(torch.cuda.device_count())]
        return min(sizes), "GPU memory"
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "RAM"


def on_gpu(trainer: DictConfig) -> bool:
    """Whether training runs on GPUs: asked for (gpu, cuda) or auto with CUDA present."""
    return trainer.accelerator in ("gpu", "cuda") or (trainer.accelerator == "auto" and torch.cuda.is_available())


def check_precision_runs_here(trainer: DictConfig) -> None:
    """Lightning runs 16-mixed on a CPU as bf16-mixed, with a warning, while the config would record 16-mixed: refuse
    a precision that would not run as written."""
    if str(trainer.precision) == "16-mixed" and not (on_gpu(trainer) and torch.cuda.is_available()):
        raise ConfigError(
            "trainer.precision",
            "16-mixed",
            "float16 autocast needs a GPU (on a CPU Lightning would run bf16-mixed and the run would record "
            "16-mixed); allowed here: 32-true, 64-true, bf16-mixed, bf16-true",
        )


def gib(n_bytes: float) -> str:
    return f"{n_bytes / 2**30:.3g} GiB"


def check_fits_in_memory(model: Transformer, trainer: DictConfig) -> None:
    params = model.num_params()
    needed = params * VALUES_PER_PARAM * BYTES_PER_VALUE.get(str(trainer.precision), 4)
    available, kind = training_memory(trainer)
    if needed > available:
        key, value = largest_dimension(model.cfg)
        raise ConfigError(
            key,
            value,
            f"a model of {params:.3g} parameters needs at least {gib(needed)} to train (weights, gradients and "
            f"Adam's two moments), more than this machine's {gib(available)} of {kind}",
        )


class ModelShape:
    """What a scan's `prepare` checks against (ablation/scans/context.py's ScanContext, in part) before any training:
    the plan (settings, mode, metric, task, address), and the model on the meta device with its heads per layer."""

    def __init__(self, planned: AblationPlan, model: Transformer):
        self.settings, self.model, self.task = planned.settings, model, planned.task
        self.mode, self.metric, self.address, self.positions = (
            planned.mode,
            planned.metric,
            planned.address,
            planned.positions,
        )
        self.heads_per_layer = model.heads_per_layer
        self.out, self.section = planned.address.folder, planned.address.section  # prepare() writes nothing


def check_ablation(settings: AblationConfig, model: Transformer, cfg: DictConfig | None = None) -> None:
    """The ablation section and each listed scan's checks, those against the model's heads included, and the task
    the config names: its prompts encoded for the model, every prompt checked, the metric and mode against it."""
    task_cfg = task_config(cfg) if cfg is not None else None
    checked = validate_settings(settings, task_cfg)
    source = None if task_cfg is None else str(task_cfg.source)
    refuse_decoder_only(settings, source, model.cfg.causal, isinstance(model, EncoderDecoder))
    if isinstance(model, EncoderDecoder):
        refuse_one_stack_only(settings, source)
    planned = plan(checked, lambda c: run_task(cfg, model, c), Path("ablation"))  # a run not made yet
    shape = ModelShape(planned, model)
    for name, scan in settings.scans.items():
        KINDS[scan.kind](name, scan, shape).prepare()
    check_export(settings.prune, model.heads_per_layer)
