"""`python tests/slow_first_writer.py <headcount-train overrides>`: headcount-train whose first process writes
metrics.json HEADCOUNT_TEST_WRITE_DELAY_S seconds late, as a loaded machine or slow storage may.

The job's other processes (Lightning's launcher reruns this script for them) write nothing and are not delayed: a
process that went on before the first had written would find no finished run. Used by
tests/test_distributed_processes.py.
"""

import os
import time


def main() -> None:
    import headcount.train.job as job
    from headcount.cli.train import main as headcount_train
    from headcount.processes import launched_as_secondary

    delay = float(os.environ["HEADCOUNT_TEST_WRITE_DELAY_S"])
    write = job.atomic_write_json

    def late_write(path, value):
        if path.name == "metrics.json" and not launched_as_secondary():
            time.sleep(delay)
        write(path, value)

    job.atomic_write_json = late_write
    headcount_train()


if __name__ == "__main__":
    main()
