"""`python tests/interrupting.py HOOK STEP SIGNAL <headcount-train overrides>`: headcount-train that interrupts itself.

When Lightning calls HOOK (a Callback hook: on_train_batch_start, on_before_optimizer_step, which is mid-step,
on_validation_batch_end, mid-validation, ...) at training step STEP (the number of optimiser steps done), the process
sends itself SIGNAL (KILL, INT, TERM, USR2), once. The callback runs before the checkpoint callbacks, so a KILL at
on_train_batch_end dies before that step's checkpoint. Used by tests/test_faults_training.py; rerunning without this
wrapper resumes the run.
"""

import os
import signal
import sys

import lightning as L


class InterruptAt(L.Callback):
    def __init__(self, hook: str, step: int, signum: int):
        self.step, self.signum, self.fired = step, signum, False
        setattr(self, hook, self._maybe_fire)

    def _maybe_fire(self, trainer: L.Trainer, *args) -> None:
        if not self.fired and trainer.global_step == self.step and not trainer.sanity_checking:
            self.fired = True
            os.kill(os.getpid(), self.signum)


def main() -> None:
    hook, step, name, *overrides = sys.argv[1:]
    import headcount.train.job as job

    build_trainer = job.build_trainer

    def build_interrupted_trainer(*args):
        trainer = build_trainer(*args)
        trainer.callbacks.insert(0, InterruptAt(hook, int(step), signal.Signals[f"SIG{name}"]))
        return trainer

    job.build_trainer = build_interrupted_trainer
    from headcount.cli.train import main as headcount_train

    sys.argv = ["headcount-train", *overrides]
    headcount_train()


if __name__ == "__main__":
    main()
