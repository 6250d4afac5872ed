"""`python tests/interrupting_ablate.py <headcount-ablate overrides>`: headcount-ablate that interrupts itself mid-scan.

With HEADCOUNT_TEST_KILL_AFTER_PASSES=N in the environment, the first process of the scan, after N masked passes,
sends its whole process group HEADCOUNT_TEST_SIGNAL (KILL by default: as a cluster killing a job would; INT: as Ctrl-C
in a terminal does), itself and the processes Lightning started for a distributed scan. The partial files are saved
after every pass. The processes Lightning adds rerun this same
script (with the same environment), so they save as often. Used by tests/test_distributed.py.
"""

import os
import signal
import sys
import time
from pathlib import Path


def main() -> None:
    from headcount.ablation.engine.evaluator import MaskEvaluator
    from headcount.ablation.records import resumable
    from headcount.cli.ablate import main as headcount_ablate
    from headcount.processes import launched_as_secondary

    resumable.SAVE_INTERVAL_S = 0.0
    kill_after = int(os.environ["HEADCOUNT_TEST_KILL_AFTER_PASSES"])
    signum = signal.Signals[f"SIG{os.environ.get('HEADCOUNT_TEST_SIGNAL', 'KILL')}"]
    real_pass, passes = MaskEvaluator.masked_pass, []
    run_dir = next(Path(a.split("=", 1)[1]) for a in sys.argv[1:] if a.startswith("run_dir="))

    def other_process_saved() -> bool:
        """The second process of a distributed scan has saved its partial sums of the scan under way: a kill then
        leaves both processes' partials, whatever the machine's load made the second one lag (one process: true)."""
        if "trainer.devices=2" not in sys.argv:
            return True
        return any((run_dir / "ablation").glob("*.partial.rank1.csv"))

    def masked_pass(self, clean, gates_PLH, start, position_P):
        sums = real_pass(self, clean, gates_PLH, start, position_P)
        if start < self.model.n_layers and not launched_as_secondary():
            passes.append(len(gates_PLH))
            if len(passes) == kill_after:
                deadline = time.monotonic() + 120
                while not other_process_saved() and time.monotonic() < deadline:
                    time.sleep(0.1)
                os.killpg(os.getpgid(0), signum)
        return sums

    MaskEvaluator.masked_pass = masked_pass
    headcount_ablate()


if __name__ == "__main__":
    sys.exit(main())
