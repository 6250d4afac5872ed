"""The typed schemas Hydra composes, registered with its ConfigStore so that a misspelt key, a wrong type or a value
outside a choice fails at compose time.

conf/train.yaml and conf/ablate.yaml name these schemas first in their defaults lists; every group file then merges
onto a typed node. A section's defaults are the values a run uses when no preset says otherwise.
"""

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError

from headcount.config.ablation import AblationConfig
from headcount.config.data import SEQ2SEQ_SOURCES, DataConfig, data_vocab_size
from headcount.config.logger import LoggerConfig, validate_logger_config
from headcount.config.model import ModelConfig, validate_model_config
from headcount.config.scans import register_scan_settings
from headcount.config.task import TaskConfig
from headcount.config.train import TrainerConfig, validate_trainer_config
from headcount.errors import ConfigError, check_seed, unknown_key

CONF_DIR = str(Path(__file__).resolve().parents[3] / "conf")


@dataclass
class TrainConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    ablation: AblationConfig = field(default_factory=AblationConfig)
    # The behaviour the scans measure: a task's prompts and answers (task=ioi, task=file task.path=...); no task (the
    # default): next-token loss on the run's own data.
    task: TaskConfig = field(default_factory=TaskConfig)
    seed: int = 0
    # Resume an interrupted run under settings other than those it started with (recorded in config_changes.json);
    # off: such a resume is refused, naming what changed.
    allow_changes: bool = False
    experiment: str | None = None  # set by experiment=<name> files; names the W&B group and the report
    # A multirun writes to outputs/multirun/<sweep_name>, default the experiment name, else "sweep": the same command
    # finds the same folder again and skips finished jobs; a fresh sweep needs a new name (or hydra.sweep.dir=...).
    sweep_name: str | None = None
    size: str = "cpu"  # cpu | gpu | smoke: which size of an experiment runs (the conf/size/ group checks the choice)
    finding: str | None = None  # set by experiment files: the published finding checked on the results


@dataclass
class AblateConfig:
    # A finished training run; with model.pretrained, the run directory that records the checkpoint and its scans
    # (default: outputs/pretrained/<checkpoint name>/<data source>-<hash of the source and the data section>, or with
    # a task <task name>-<hash of the source, the data and the task sections>).
    run_dir: str = MISSING
    ablation: AblationConfig = field(default_factory=AblationConfig)
    # A task to measure instead of the run's data (default: the run's own task section, if it has one)
    task: TaskConfig = field(default_factory=TaskConfig)
    # Only with model.pretrained (a training run brings its own): the model, the data and the seed.
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    seed: int = 0
    # The processes a scan is shared out over, read as training reads them (accelerator, devices, num_nodes,
    # strategy; trainer=ddp): one by default. The run's own trainer section is not used: a run is often ablated
    # elsewhere than it trained.
    trainer: TrainerConfig = field(default_factory=TrainerConfig)


def register_configs() -> None:
    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainConfig)
    cs.store(name="ablate_schema", node=AblateConfig)
    register_scan_settings(cs)
    # (No schema in the ablation group: every option there is offered as a scan, and ablation.scans is typed by
    # AblationConfig already.)


def typed(section: DictConfig | dict, schema: type):
    """A config section as its dataclass, with the schema's defaults for any key it lacks (a run's saved config is
    plain YAML; a composed one is typed already)."""
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), section))


def plain(section) -> dict:
    """A dataclass or config section as plain dicts, lists and strings (choices as their values): what checkpoints and
    loggers store."""
    return OmegaConf.to_container(OmegaConf.structured(section), resolve=True, enum_to_str=True)


def check_schema_keys(cfg: DictConfig, schema: type) -> None:
    """ConfigError for a key the schema does not have: Hydra lets `+trainer.max_step=10` add one, which nothing would
    read (the run would ignore it and look as if it had used it)."""
    try:
        OmegaConf.merge(OmegaConf.structured(schema), OmegaConf.to_container(cfg))
    except ConfigKeyError as e:
        keys = list(e.parent_node.keys()) if e.parent_node is not None else []
        raise unknown_key(e.full_key, OmegaConf.select(cfg, e.full_key), keys) from None


def check_bool_overrides(cfg: DictConfig, overrides: Iterable[str]) -> None:
    """ConfigError for a command-line value given to a true/false key that is not true or false: OmegaConf reads
    `model.embed_scale=2` (or 1, yes, on) as true, and the run would not say so. cfg: the config composed from
    overrides (a sweep's: one job's, its own overrides)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    for override in OverridesParser.create().parse_overrides(list(overrides)):
        if override.is_delete() or override.is_sweep_override():
            continue
        key = override.key_or_group
        if isinstance(OmegaConf.select(cfg, key, default=None), bool) and not isinstance(override.value(), bool):
            raise ConfigError(key, override.value(), "must be true or false")


def check_model_reads_its_data(model: ModelConfig, data: DataConfig) -> None:
    """An encoder-decoder trains on source and target sequences, and only it does; said before the lengths and
    vocabularies, whose errors would name the symptom."""
    seq2seq = data.source in SEQ2SEQ_SOURCES
    if model.encoder_layers and not seq2seq and model.pretrained is None:
        allowed = f"an encoder-decoder (model.encoder_layers={model.encoder_layers}) trains on " + " or ".join(
            f"data={source}" for source in SEQ2SEQ_SOURCES
        )
        raise ConfigError("data.source", data.source, allowed + " (source and target sequences)")
    if seq2seq and not model.encoder_layers and model.pretrained is None:
        allowed = "gives source and target sequences to an encoder-decoder (model.encoder_layers > 0, e.g. "
        raise ConfigError("data.source", data.source, allowed + "model=nmt_encdec); a decoder reads data=translation")


def validate_train_config(cfg: DictConfig) -> None:
    """Each section's own checks and those across sections; raises ConfigError."""
    check_schema_keys(cfg, TrainConfig)
    check_seed("seed", cfg.seed)
    model: ModelConfig = typed(cfg.model, ModelConfig)
    data: DataConfig = typed(cfg.data, DataConfig)
    validate_model_config(model)
    check_model_reads_its_data(model, data)
    data_vocab = data_vocab_size(data)
    if not model.causal and model.pretrained is None and data_vocab is not None and data_vocab >= model.vocab_size:
        # an encoder trains on the masked-LM objective; its mask token is the id after the data's (train/masking.py)
        allowed = f"must be at least the data's vocabulary + 1 ({data_vocab + 1}) on an encoder (model.causal=false):"
        raise ConfigError("model.vocab_size", model.vocab_size, allowed + " the mask token is the id after the data's")
    # max_steps=0 evaluates a pretrained model as it is; a model built from scratch needs training
    validate_trainer_config(typed(cfg.trainer, TrainerConfig), least_steps=0 if model.pretrained else 1)
    validate_logger_config(typed(cfg.logger, LoggerConfig))
    if data.seq_len > model.n_ctx and model.pretrained is None:  # a checkpoint's context: pretrained/run_config.py
        raise ConfigError("data.seq_len", data.seq_len, f"must be at most model.n_ctx={model.n_ctx}")
    if data_vocab is not None and data_vocab > model.vocab_size:
        raise ConfigError(
            "model.vocab_size", model.vocab_size, f"must be at least the data's vocabulary ({data_vocab})"
        )
