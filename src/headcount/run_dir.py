"""The run directory contract (docs/DESIGN.md): `.hydra/`, `checkpoints/last.ckpt`, `metrics.json`,
`data_fingerprint.json`, `pretrained.json` (a run that starts from model.pretrained), `ablation/`, `DONE` last.

A run whose model is a pretrained checkpoint as it is (headcount-ablate model.pretrained=..., or headcount-train with
trainer.max_steps=0) has no last.ckpt: its pretrained.json names the source and the sha256 of its files, and the
model is read from the source again, refused if those files changed.

Each stage reads the previous stage's files from here, so any stage can be rerun alone. `load_run` is the one way a
later stage (the ablations, the findings) opens a finished run: its config, checkpoint, model and data splits.
"""

import copy
import json
import zipfile
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from omegaconf import DictConfig, OmegaConf

from headcount.config.data import DataConfig
from headcount.config.model import ModelConfig
from headcount.errors import ConfigError
from headcount.io import atomic_write_json, atomic_write_text

if TYPE_CHECKING:  # torch and the model load where a run's weights are read: the commands check paths before that
    import torch
    from datasets import Dataset
    from torch import Tensor

    from headcount.model.transformer import Transformer


@dataclass(frozen=True)
class RunPaths:
    root: Path

    @property
    def config(self) -> Path:
        return self.root / ".hydra" / "config.yaml"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def last_ckpt(self) -> Path:
        return self.checkpoints / "last.ckpt"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.json"

    @property
    def data_fingerprint(self) -> Path:
        return self.root / "data_fingerprint.json"

    @property
    def pretrained(self) -> Path:
        return self.root / "pretrained.json"

    @property
    def ablation(self) -> Path:
        return self.root / "ablation"

    @property
    def done(self) -> Path:
        return self.root / "DONE"


def is_done(run_dir: str | Path) -> bool:
    return RunPaths(Path(run_dir)).done.exists()


def mark_done(run_dir: str | Path) -> None:
    atomic_write_text(RunPaths(Path(run_dir)).done, "")


def record_data_fingerprint(run_dir: str | Path, splits: dict[str, "Dataset"]) -> None:
    """Write the content fingerprint of the splits a run trains on, which later stages check their data against."""
    from headcount.data.fingerprint import data_fingerprint

    atomic_write_json(RunPaths(Path(run_dir)).data_fingerprint, data_fingerprint(splits))


def read_data_fingerprint(run_dir: str | Path) -> dict | None:
    """The data fingerprint training recorded; None for a run trained before headcount recorded one."""
    path = RunPaths(Path(run_dir)).data_fingerprint
    return json.loads(path.read_text()) if path.exists() else None


def record_pretrained(run_dir: str | Path, provenance: dict, model: dict, as_pretrained: bool) -> None:
    """pretrained.json: the source's provenance, the model config it implies, and whether the run's model is the
    checkpoint as it is (no training) or was fine-tuned from it (then checkpoints/ hold its weights)."""
    record = {"provenance": provenance, "model": model, "weights": "as_pretrained" if as_pretrained else "fine_tuned"}
    atomic_write_json(RunPaths(Path(run_dir)).pretrained, record)


def read_pretrained(run_dir: str | Path) -> dict | None:
    path = RunPaths(Path(run_dir)).pretrained
    return json.loads(path.read_text()) if path.exists() else None


def pretrained_model(run_dir: str | Path, record: dict) -> "Transformer":
    """The model of a run that uses its pretrained checkpoint as it is, refused if the source's files changed."""
    from headcount.pretrained.run_config import cached_pretrained

    recorded = record["provenance"]
    model, _, provenance = cached_pretrained(recorded["source"])
    for key in ("files", "revision"):
        if recorded.get(key) != provenance.get(key):
            raise ConfigError(
                "run_dir",
                str(run_dir),
                f"its model.pretrained={recorded['source']} changed since the run recorded it ({key} differ); "
                "ablate it in a new run directory",
            )
    return copy.deepcopy(model)  # the cached one stays as read: scans may move or cast theirs


def model_config_from_dict(model: dict | DictConfig) -> ModelConfig:
    """A typed ModelConfig from a plain or OmegaConf mapping (what checkpoints and run configs store)."""
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig), model))


def read_checkpoint(path: str | Path, remedy: str, map_location: "str | torch.device" = "cpu") -> dict:
    """A checkpoint's contents, its tensors memory-mapped rather than read; a file that cannot be read (truncated,
    damaged, not a checkpoint) is a ConfigError naming it and what to do."""
    import torch

    try:
        return torch.load(path, map_location=map_location, weights_only=False, mmap=True)
    except Exception as error:  # a damaged file fails in the zip reader (OSError at some lengths) or the unpickler
        reason = "not a complete zip archive" if not zipfile.is_zipfile(path) else str(error).strip().split("\n")[0]
        raise ConfigError("checkpoint", str(path), f"is damaged or incomplete ({reason}); {remedy}") from error


DAMAGED_MODEL = "it holds the run's weights: restore it from a copy, or train the run again"


def load_model(ckpt_path: str | Path, map_location: "str | torch.device" = "cpu") -> "Transformer":
    """The Transformer stored in a headcount checkpoint (a Lightning one or a structurally pruned export), in eval
    mode (dropout off), as load_run gives it; ConfigError for a file that cannot be read."""
    from headcount.model.encoder_decoder import build_model

    ckpt = read_checkpoint(ckpt_path, DAMAGED_MODEL, map_location)
    model = build_model(model_config_from_dict(ckpt["hyper_parameters"]["model"]))  # an EncoderDecoder too
    state = {k.removeprefix("model."): v for k, v in ckpt["state_dict"].items() if k.startswith("model.")}
    model.load_state_dict(state)
    return model.eval()


def load_run_config(run_dir: str | Path) -> DictConfig:
    paths = RunPaths(Path(run_dir))
    if not paths.config.exists():
        raise ConfigError("run_dir", str(run_dir), "is not a headcount run directory (no .hydra/config.yaml)")
    return OmegaConf.load(paths.config)


def finished_checkpoint(run_dir: str | Path) -> Path:
    """last.ckpt of a run whose training finished (metrics.json is written after the last step)."""
    paths = RunPaths(Path(run_dir))
    if not (paths.last_ckpt.exists() and paths.metrics.exists()):
        raise ConfigError(
            "run_dir", str(run_dir), "has no finished training run (needs checkpoints/last.ckpt and metrics.json)"
        )
    return paths.last_ckpt


@dataclass
class FinishedRun:
    """A finished training run, opened for a later stage. The data splits are built on first use, so that checks
    against the model fail before any data is read."""

    config: DictConfig  # the run's config (train config: model, data, seed, ablation)
    checkpoint: Path | None  # None: the model is its pretrained checkpoint as it is (pretrained.json)
    model: "Transformer"  # on the CPU, in eval mode, in the checkpoint's dtype

    @cached_property
    def splits(self) -> dict[str, "Dataset"]:
        from headcount.data import HeadcountDataModule  # datasets and tokenisers load only when data is needed
        from headcount.pretrained.run_config import text_tokenizer

        data_cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(DataConfig), self.config.data))
        data = HeadcountDataModule(data_cfg, text_tokenizer(self.config))
        data.setup()
        return data.splits

    def examples(self, split: str, n: int | None, key: str) -> dict[str, "Tensor"]:
        """The first n examples of a split (all when n is None); ConfigError names `key` for a split it lacks."""
        from headcount.data.examples import split_examples

        return split_examples(self.splits, split, n, key)

    def eval_batches(self, device: "str | torch.device" = "cpu") -> list[dict[str, "Tensor"]]:
        """The ablation split's examples in the ablation batches, as the scans saw them."""
        import torch

        from headcount.data.examples import to_batches

        a = self.config.ablation
        return to_batches(self.examples(a.split, a.n_eval, "ablation.split"), a.batch_size, torch.device(device))


def load_run(run_dir: str | Path, config: DictConfig | None = None) -> FinishedRun:
    """The finished run in run_dir, under `config` (default: the run's own .hydra/config.yaml)."""
    config = load_run_config(run_dir) if config is None else config
    record = read_pretrained(run_dir)
    if record is not None and record["weights"] == "as_pretrained":
        return FinishedRun(config, None, pretrained_model(run_dir, record).eval())
    checkpoint = finished_checkpoint(run_dir)
    return FinishedRun(config, checkpoint, load_model(checkpoint).eval())
