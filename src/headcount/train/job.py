"""Training one run: fit, resume from last.ckpt if the run was interrupted, evaluate, write metrics.json.

With model.pretrained (cfg resolved by headcount.pretrained.run_config), training starts from the checkpoint's
weights and records pretrained.json; trainer.max_steps=0 evaluates the checkpoint as it is, without fitting.

A rerun of an interrupted run (killed, stopped by a signal, requeued) resumes from checkpoints/last.ckpt and ends
bit for bit where the uninterrupted run ends, on the same machine at the same CPU thread count
(train/checkpointing.py says what a checkpoint holds). A last.ckpt that cannot be read is refused before anything is
written or deleted.
"""

import json
import logging
from pathlib import Path

import lightning as L
import torch
from omegaconf import DictConfig

from headcount.config import plain, typed
from headcount.config.data import DataConfig
from headcount.io import atomic_write_json
from headcount.pretrained.run_config import cached_pretrained, text_tokenizer
from headcount.run_dir import RunPaths, read_checkpoint, record_data_fingerprint, record_pretrained
from headcount.train.loggers import make_logger
from headcount.train.masking import masking_for
from headcount.train.module import HeadcountModule
from headcount.train.quiet import quiet_third_party
from headcount.train.trainer import build_trainer

log = logging.getLogger(__name__)

DAMAGED_LAST = "delete it to train from scratch, or copy best.ckpt over it to resume from the best validation"


def resume_step(paths: RunPaths) -> int | None:
    """The step last.ckpt was written at, None without one; ConfigError if it cannot be read."""
    if not paths.last_ckpt.exists():
        return None
    return int(read_checkpoint(paths.last_ckpt, DAMAGED_LAST)["global_step"])


def finished_training(paths: RunPaths, max_steps: int) -> dict | None:
    """metrics.json of a run whose training and evaluation finished at max_steps, else None (a run extended to more
    steps trains on from last.ckpt)."""
    if not (paths.metrics.exists() and paths.last_ckpt.exists()):
        return None
    metrics = json.loads(paths.metrics.read_text())
    return metrics if metrics.get("steps") == max_steps else None


def describe_model(module: HeadcountModule, seq_len: int) -> str:
    model = module.model
    if model.cfg.encoder_layers:  # an encoder-decoder: FLOPs per token are the decoder-only model's measure
        return f"model: {model.num_params():,} parameters (an encoder-decoder)"
    return (
        f"model: {model.num_params():,} parameters ({model.num_params(non_embedding=True):,} without embeddings), "
        f"{model.flops_per_token(seq_len):,.0f} training FLOPs per token"
    )


def model_sizes(model, seq_len: int) -> dict:
    """params_non_embedding and flops_per_token of a one-stack model; an encoder-decoder's parameters without its
    shared token embedding, and no FLOPs count (Transformer.flops_per_token counts one stack, no cross-attention)."""
    if not model.cfg.encoder_layers:
        return {
            "params_non_embedding": model.num_params(non_embedding=True),
            "flops_per_token": model.flops_per_token(seq_len),
        }
    embedding = model.decoder.tok_emb.weight.numel()
    return {"params_non_embedding": model.num_params() - embedding, "flops_per_token": None}


def start_from_pretrained(module: HeadcountModule, cfg: DictConfig, run_dir: Path) -> None:
    """The checkpoint's weights into the module, and pretrained.json: what they came from."""
    pretrained = cached_pretrained(cfg.model.pretrained)
    module.model.load_state_dict(pretrained.model.state_dict())
    as_pretrained = cfg.trainer.max_steps == 0
    record_pretrained(run_dir, pretrained.provenance, plain(cfg.model), as_pretrained)


def train(cfg: DictConfig, run_dir: Path) -> dict:
    """Train (resuming from last.ckpt if the run was interrupted), evaluate, write metrics.json; returns the metrics.
    A run whose training and evaluation finished at these max_steps (metrics.json is written last), stopped later in
    its scans, is not trained or evaluated again: its metrics.json is the answer, and its curves get no second set of
    final rows."""
    from headcount.data import HeadcountDataModule

    quiet_third_party()
    paths = RunPaths(run_dir)
    finished = finished_training(paths, cfg.trainer.max_steps)
    if finished is not None:
        if cfg.logger.kind == "wandb":
            _ = make_logger(cfg, run_dir).experiment  # the run's W&B run continues, for the results the scans log
        return finished
    resumed_at = resume_step(paths)
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    data = HeadcountDataModule(typed(cfg.data, DataConfig), text_tokenizer(cfg))
    data.setup()  # bad data input fails here, before any checkpoint or log is written
    record_data_fingerprint(run_dir, data.splits)  # later stages check that they see the data trained on
    module = HeadcountModule(
        model=plain(cfg.model),
        optim=plain(cfg.trainer.optim),
        max_steps=cfg.trainer.max_steps,
        compile=cfg.trainer.compile,
        masking=None if cfg.model.causal else masking_for(cfg, cfg.model.vocab_size).record(),
    )
    if cfg.model.pretrained is not None and resumed_at is None:  # a resumed run's weights come from last.ckpt
        start_from_pretrained(module, cfg, run_dir)
    logger = make_logger(cfg, run_dir)
    trainer = build_trainer(cfg, run_dir, logger)
    if trainer.is_global_zero:
        log.info(describe_model(module, cfg.data.seq_len))
        if resumed_at is not None:
            log.info("resuming from %s (step %d of %d)", paths.last_ckpt, resumed_at, cfg.trainer.max_steps)
    if cfg.trainer.max_steps > 0:
        trainer.fit(module, datamodule=data, ckpt_path=paths.last_ckpt if resumed_at is not None else None)
    seconds = module.train_seconds()
    val = trainer.validate(module, datamodule=data, verbose=False)[0]
    test = trainer.test(module, datamodule=data, verbose=False)[0]
    tokens = cfg.trainer.max_steps * cfg.data.batch_size * cfg.data.seq_len
    metrics = {
        **{k: float(v) for k, v in {**val, **test}.items()},
        "params": module.model.num_params(),
        **model_sizes(module.model, cfg.data.seq_len),
        "steps": int(trainer.global_step),
        "resumed_from_step": resumed_at,  # None: trained in one process
        "train_seconds": seconds,  # every process that trained the run, the time to each one's last checkpoint
        "tokens_per_second": tokens / seconds if tokens and seconds else None,
        # CPU results are bit for bit only at the same thread count: float sums split differently across threads.
        "cpu_threads": torch.get_num_threads(),
    }
    if trainer.is_global_zero:
        atomic_write_json(paths.metrics, metrics)
    # Every process goes on to the scans, which open the finished run: none may look before the first has written it
    trainer.strategy.barrier("metrics.json written")
    return metrics
