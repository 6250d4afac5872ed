"""The LightningModule: next-token training of a Transformer on the positions loss_mask marks."""

import math

import lightning as L
import torch

from headcount.metrics import masked_loss_and_accuracy
from headcount.run_dir import model_config_from_dict


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
