"""How much a run prints: quiet by default, Lightning's own output and every warning with -v, debug logs with -vv.

Quiet means no third-party tips, hints or deprecation notices, and none of Lightning's setup lines (devices, its model
summary, "fit stopped"): headcount prints its own one-line model summary, a step progress bar and an end-of-run
summary. Warnings about the run itself still show. The level travels in the environment (HEADCOUNT_VERBOSITY), so DDP
processes and SLURM jobs started from the command inherit it.
"""

import logging
import os
import sys
import warnings

VERBOSITY_ENV = "HEADCOUNT_VERBOSITY"
FLAGS = {"-v": 1, "--verbose": 1, "-vv": 2, "-vvv": 2}

# Each filter names one message that says nothing about the run, and why it is dropped.
NOISE = [
    # Lightning, on any machine where SLURM is installed, when a run was not started by srun: a hint to use srun,
    # for a run that is meant to run right here (SLURM jobs go through hydra/launcher=slurm).
    r"The `srun` command is available on your system but is not used",
    # torch deprecates LeafSpec, which Lightning's pytree helpers still check against: once per job, about their code.
    r"`isinstance\(treespec, LeafSpec\)` is deprecated",
    # Lightning compares log_every_n_steps with the batches of one epoch; curves here are logged by step across epochs.
    r"The number of training batches \(\d+\) is smaller than the logging interval",
    # ModelCheckpoint, on a resumed run: the checkpoints folder holds the run's own checkpoints, as it should.
    r"Checkpoint directory .* exists and is not empty",
    # A distributed scan's predict steps add to the per-mask sums they keep and return nothing, on purpose.
    r"predict returned None if it was on purpose",
    # val/ and test/ numbers are logged after one all-reduce of their sums (train/module.py), the same in every
    # process: Lightning's sync_dist would average equal values again, where it warns.
    r"It is recommended to use `self.log\('(val|test)/",
]


def verbosity() -> int:
    try:
        return int(os.environ.get(VERBOSITY_ENV, "0"))
    except ValueError:
        return 0


def take_verbosity_flags(args: list[str]) -> list[str]:
    """The command-line arguments without -v / -vv / --verbose (Hydra would take them for overrides); the level they
    ask for goes to the environment."""
    level = max((FLAGS[arg] for arg in args if arg in FLAGS), default=None)
    if level is not None:
        os.environ[VERBOSITY_ENV] = str(level)
    if verbosity() == 0:
        # transformers and the Hub read these when first imported (a pretrained model's load, before training starts):
        # no progress bars for converting and loading a checkpoint, and only its errors.
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        # datasets' bars while a text source builds its cache once ("Generating", "Saving the dataset")
        os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
        if "datasets" in sys.modules:  # imported already (the commands import the data stage): it read the variable
            sys.modules["datasets"].disable_progress_bars()
    return [arg for arg in args if arg not in FLAGS]


def quiet_third_party() -> None:
    """Installs the filters for the current verbosity; call before Lightning or W&B starts."""
    level = verbosity()
    lightning_level = {0: logging.WARNING, 1: logging.INFO}.get(level, logging.DEBUG)
    for name in ("lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(lightning_level)
    if level >= 2:
        logging.getLogger("headcount").setLevel(logging.DEBUG)
    if level > 0:
        return
    os.environ.setdefault("WANDB_SILENT", "true")  # W&B's notices (login, sync hints, the run's history at exit)
    for message in NOISE:
        warnings.filterwarnings("ignore", message=message)
