"""Training: the LightningModule and the `headcount-train` entry point (train, then run the configured ablations)."""

import logging
import math
import sys
import time
from pathlib import Path

import hydra
import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch.callbacks import ModelCheckpoint, RichProgressBar
from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.markup import escape

from headcount.config import CONF_DIR, register_configs, validate_train_config
from headcount.ddp import ddp_confined_to_this_job
from headcount.errors import ConfigError
from headcount.findings import check_finding, reads_sweep, validate_finding
from headcount.gpus import own_gpu_in_a_sweep
from headcount.io import atomic_write_json
from headcount.metrics import masked_loss_and_accuracy
from headcount.run_dir import RunPaths, is_done, mark_done, model_config_from_dict
from headcount.sweep import check_launcher_installed, register_resolvers
from headcount.tracking import closing_wandb_run, log_run_results, make_logger, validate_wandb_config

log = logging.getLogger(__name__)


class NonFiniteLossError(RuntimeError):
    pass


class HeadcountModule(L.LightningModule):
    """Next-token training on the loss_mask positions. Hyperparameters hold the model config as a plain dict, so a
    checkpoint alone rebuilds its model (see run_dir.load_model)."""

    def __init__(self, model: dict, optim: dict, max_steps: int, compile: bool = False):
        super().__init__()
        self.save_hyperparameters()
        from headcount.model import Transformer

        self.model = Transformer(model_config_from_dict(model))
        if compile:
            self.model.compile()

    def forward(self, input_ids_BT: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids_BT)

    def _step(self, batch: dict, split: str) -> torch.Tensor:
        logits_BTV = self.model(batch["input_ids"])
        loss, acc = masked_loss_and_accuracy(logits_BTV, batch["input_ids"], batch["loss_mask"])
        on_step = split == "train"
        # Under DDP each process sees a shard of val/test: average the epoch metrics over processes.
        when = dict(on_step=on_step, on_epoch=not on_step, sync_dist=not on_step)
        self.log(f"{split}/loss", loss, prog_bar=True, **when)
        self.log(f"{split}/acc", acc, prog_bar=split != "train", **when)
        return loss

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        loss = self._step(batch, "train")
        if not torch.isfinite(loss):
            raise NonFiniteLossError(f"training loss is {loss.item()} at step {self.global_step}; stopping")
        return loss

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self._step(batch, "val")

    def test_step(self, batch: dict, batch_idx: int) -> None:
        self._step(batch, "test")

    def configure_optimizers(self):
        o = self.hparams.optim
        # Weight decay on matrices only (nanoGPT): not on biases, LayerNorm gains or embeddings.
        decay = [p for n, p in self.model.named_parameters() if p.ndim >= 2 and "emb" not in n]
        no_decay = [p for n, p in self.model.named_parameters() if not (p.ndim >= 2 and "emb" not in n)]
        optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": o["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}],
            lr=o["lr"],
            betas=(o["beta1"], o["beta2"]),
        )
        schedule = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: warmup_cosine(step, o["warmup_steps"], self.hparams.max_steps, o["min_lr_ratio"])
        )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


def warmup_cosine(step: int, warmup: int, total: int, min_ratio: float) -> float:
    """Learning-rate multiplier: linear warmup, then cosine decay to min_ratio at `total` steps."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def build_trainer(cfg: DictConfig, run_dir: Path, logger) -> L.Trainer:
    t = cfg.trainer
    callbacks = [
        ModelCheckpoint(
            dirpath=RunPaths(run_dir).checkpoints,
            filename="best",
            monitor="val/loss",
            save_last=True,
            save_top_k=1,
            enable_version_counter=False,
        )
    ]
    if t.progress_bar:
        callbacks.append(RichProgressBar())
    return L.Trainer(
        accelerator=t.accelerator,
        devices=t.devices,
        strategy=t.strategy,
        num_nodes=t.num_nodes,
        precision=t.precision,
        max_steps=t.max_steps,
        val_check_interval=min(t.val_check_interval, t.max_steps),
        check_val_every_n_epoch=None,
        limit_val_batches=t.limit_val_batches,
        log_every_n_steps=t.log_every_n_steps,
        gradient_clip_val=t.optim.grad_clip or None,
        deterministic=t.deterministic,
        enable_progress_bar=t.progress_bar,
        logger=logger if logger is not None else False,
        callbacks=callbacks,
        default_root_dir=run_dir,
    )


def train(cfg: DictConfig, run_dir: Path) -> dict:
    """Train (resuming from last.ckpt if the run was interrupted), evaluate, write metrics.json; returns the metrics."""
    from headcount.data import HeadcountDataModule

    paths = RunPaths(run_dir)
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    data = HeadcountDataModule(OmegaConf.to_object(cfg.data))
    data.setup()  # bad data input fails here, before any checkpoint or log is written
    module = HeadcountModule(
        model=OmegaConf.to_container(cfg.model, resolve=True),
        optim=OmegaConf.to_container(cfg.trainer.optim, resolve=True),
        max_steps=cfg.trainer.max_steps,
        compile=cfg.trainer.compile,
    )
    logger = make_logger(cfg, run_dir)
    trainer = build_trainer(cfg, run_dir, logger)
    resume = paths.last_ckpt if paths.last_ckpt.exists() else None
    if resume:
        log.info("resuming from %s", resume)
    start = time.perf_counter()
    trainer.fit(module, datamodule=data, ckpt_path=resume)
    seconds = time.perf_counter() - start
    val = trainer.validate(module, datamodule=data, verbose=False)[0]
    test = trainer.test(module, datamodule=data, verbose=False)[0]
    tokens = cfg.trainer.max_steps * cfg.data.batch_size * cfg.data.seq_len
    metrics = {
        **{k: float(v) for k, v in {**val, **test}.items()},
        "params": module.model.num_params(),
        "params_non_embedding": module.model.num_params(non_embedding=True),
        "flops_per_token": module.model.flops_per_token(cfg.data.seq_len),
        "steps": int(trainer.global_step),
        "train_seconds": seconds,
        "tokens_per_second": tokens / seconds if not resume else None,
        # CPU results are bit for bit only at the same thread count: float sums split differently across threads.
        "cpu_threads": torch.get_num_threads(),
    }
    if trainer.is_global_zero:
        atomic_write_json(paths.metrics, metrics)
    return metrics


def validate_job(cfg: DictConfig) -> None:
    """Everything about one job's config that can fail before training; a multirun runs it on every job first."""
    validate_train_config(cfg)
    validate_finding(cfg.finding)
    if cfg.logger.kind == "wandb":
        validate_wandb_config(cfg.logger.wandb)


def run(cfg: DictConfig, run_dir: Path) -> None:
    """The whole job for one run directory: validate, train, ablate, mark DONE. Skips a run that is already DONE."""
    console = Console(stderr=True)
    if is_done(run_dir):
        console.print(f"[green]already finished:[/green] {run_dir} (delete DONE to rerun)")
        return
    validate_job(cfg)
    with closing_wandb_run(), own_gpu_in_a_sweep(cfg), ddp_confined_to_this_job():
        metrics = train(cfg, run_dir)
        if rank_zero_only.rank != 0:
            return  # DDP children: rank 0 alone runs the ablations and writes the results and DONE
        if cfg.ablation.scans:
            from headcount.ablation import run_ablations

            run_ablations(cfg, run_dir)
        if cfg.logger.kind == "wandb":
            log_run_results(run_dir, metrics)
        mark_done(run_dir)
    console.print(f"[bold]val/loss[/bold] {metrics['val/loss']:.4f}  [bold]test/loss[/bold] {metrics['test/loss']:.4f}")
    console.print(f"[green]wrote[/green] {escape(str(run_dir))}")
    written = (p for p in run_dir.rglob("*") if p.suffix in {".json", ".csv", ".png", ".ckpt"})
    for path in sorted(p.relative_to(run_dir) for p in written):
        if path.parts[0] != "wandb":  # W&B's own files are many; `wandb sync` reads them
            console.print(f"  {path}")


def exit_on_config_error(fn):
    """Bad input becomes one line on stderr and exit code 2 (a diverged run: exit 1), not a traceback."""

    def wrapped(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (ConfigError, NonFiniteLossError) as e:
            Console(stderr=True).print(f"[red]error:[/red] {e}", highlight=False, soft_wrap=True)
            sys.exit(2 if isinstance(e, ConfigError) else 1)

    return wrapped


register_configs()
register_resolvers()


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="train")
@exit_on_config_error
def train_job(cfg: DictConfig) -> None:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    run(cfg, run_dir)
    if cfg.finding is not None and not reads_sweep(cfg.finding) and rank_zero_only.rank == 0:
        written = check_finding(cfg.finding, run_dir)
        Console(stderr=True).print(f"[green]wrote[/green] {escape(str(written))}", soft_wrap=True)


def main() -> None:
    """`headcount-train [-m] <overrides>`: a missing launcher plugin is reported before Hydra reads any config."""
    exit_on_config_error(check_launcher_installed)(sys.argv[1:])
    train_job()


if __name__ == "__main__":
    main()
