"""The LightningModule: next-token training of a Transformer on the positions loss_mask marks, or an encoder-decoder's
teacher-forced sequence-to-sequence training (the same loss on its decoder's stream, given the source)."""

import math
import time
from typing import Any

import lightning as L
import torch

from headcount.errors import ConfigError
from headcount.metrics import masked_loss_and_accuracy, masked_token_sums, per_token
from headcount.run_dir import model_config_from_dict


class NonFiniteLossError(RuntimeError):
    pass


class HeadcountModule(L.LightningModule):
    """Next-token training on the loss_mask positions. Hyperparameters hold the model config as a plain dict, so a
    checkpoint alone rebuilds its model (see run_dir.load_model).

    Training logs the step's batch loss to the progress bar only: the curve's rows are written by train/curves.py, so
    that a step's row is on disk before that step's checkpoint. Validation and test log per-token numbers over the
    whole split (metrics.py), summed across processes under DDP, each example once (data/datamodule.py)."""

    def __init__(self, model: dict, optim: dict, max_steps: int, compile: bool = False):
        super().__init__()
        self.save_hyperparameters()
        from headcount.model import build_model

        self.model = build_model(model_config_from_dict(model))  # a Transformer, or an EncoderDecoder
        if compile:
            self.model.compile()
        self._split_sums: torch.Tensor | None = None
        # Training seconds of the processes before this one (from the checkpoint resumed), and when this one began.
        self.seconds_before, self._started = 0.0, None

    def train_seconds(self) -> float:
        """Seconds spent training to this point, over every process that trained this run."""
        return self.seconds_before + (time.perf_counter() - self._started if self._started is not None else 0.0)

    def on_train_start(self) -> None:
        self._started = time.perf_counter()

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["train_seconds"] = self.train_seconds()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.seconds_before = float(checkpoint.get("train_seconds", 0.0))

    def forward(self, input_ids_BT: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids_BT)

    def logits(self, batch: dict) -> torch.Tensor:
        """The logits of a batch's input_ids; an encoder-decoder's decoder reads them teacher-forced, conditioned on
        the batch's src_ids (model/seq2seq.py), so the same next-token loss on loss_mask is its seq2seq loss."""
        if not self.model.cfg.encoder_layers:
            return self.model(batch["input_ids"])
        if "src_ids" not in batch:
            allowed = "needs a data source with source sequences (src_ids): a sequence-to-sequence task"
            raise ConfigError("model.encoder_layers", self.model.cfg.encoder_layers, allowed)
        return self.model(batch["src_ids"], batch["input_ids"], src_keep=batch.get("src_mask"))

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        logits_BTV = self.logits(batch)
        loss, acc = masked_loss_and_accuracy(logits_BTV, batch["input_ids"], batch["loss_mask"])
        if not torch.isfinite(loss):
            raise NonFiniteLossError(f"training loss is {loss.item()} at step {self.global_step}; stopping")
        self.log("train/loss", loss, on_step=True, on_epoch=False, prog_bar=True, logger=False)
        self.log("train/acc", acc, on_step=True, on_epoch=False, logger=False)
        return loss

    def _add_batch(self, batch: dict) -> None:
        logits_BTV = self.logits(batch)
        sums = masked_token_sums(logits_BTV, batch["input_ids"], batch["loss_mask"])
        self._split_sums = sums if self._split_sums is None else self._split_sums + sums

    def _log_split(self, split: str) -> None:
        sums, self._split_sums = self._split_sums, None
        if sums is None:  # no batch at all (limit_val_batches=0)
            return
        # every process holds the whole split's sums after the reduce, so each logs the same numbers: no sync_dist
        loss, acc = per_token(self.trainer.strategy.reduce(sums, reduce_op="sum"))
        self.log(f"{split}/loss", loss, prog_bar=True)
        self.log(f"{split}/acc", acc, prog_bar=split == "val")

    def on_validation_epoch_start(self) -> None:
        self._split_sums = None  # a validation cut short by an exception leaves its partial sums behind

    def on_test_epoch_start(self) -> None:
        self._split_sums = None

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self._add_batch(batch)

    def on_validation_epoch_end(self) -> None:
        self._log_split("val")

    def test_step(self, batch: dict, batch_idx: int) -> None:
        self._add_batch(batch)

    def on_test_epoch_end(self) -> None:
        self._log_split("test")

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
