"""`python tests/interrupting.py HOOK STEP SIGNALS <headcount-train overrides>`: headcount-train that interrupts itself.

When Lightning calls HOOK (a Callback hook: on_train_batch_start, on_before_optimizer_step, which is mid-step,
on_validation_batch_end, mid-validation, ...) at training step STEP (the number of optimiser steps done), the process
sends itself SIGNALS (KILL, INT, TERM, USR2; INT,INT for Ctrl-C pressed twice), once. The callback runs before the
checkpoint callbacks, so a KILL at on_train_batch_end dies before that step's checkpoint. Used by
tests/test_faults_training.py; rerunning without this wrapper resumes the run.
"""

import os
import signal
import sys

import lightning as L


class InterruptAt(L.Callback):
    def __init__(self, hook: str, step: int, signals: list[int]):
        self.step, self.signals, self.fired = step, signals, False
        setattr(self, hook, self._maybe_fire)

    def _maybe_fire(self, trainer: L.Trainer, *args) -> None:
        if not self.fired and trainer.global_step == self.step and not trainer.sanity_checking:
            self.fired = True
            for signum in self.signals:
                os.kill(os.getpid(), signum)


def main() -> None:
    hook, step, names, *overrides = sys.argv[1:]
    signals = [signal.Signals[f"SIG{name}"] for name in names.split(",")]
    import headcount.train.job as job

    build_trainer = job.build_trainer

    def build_interrupted_trainer(*args):
        trainer = build_trainer(*args)
        trainer.callbacks.insert(0, InterruptAt(hook, int(step), signals))
        return trainer

    job.build_trainer = build_interrupted_trainer
    from headcount.cli.train import main as headcount_train

    sys.argv = ["headcount-train", *overrides]
    headcount_train()


if __name__ == "__main__":
    main()
