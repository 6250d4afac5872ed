"""Which process of a multi-process job this one is: the first writes the files and talks to the terminal, the others
only compute.

A distributed scan (ablation/records/distributed.py) runs the same session in every process, in lockstep: the processes
Lightning's DDP launcher starts rerun the command, SLURM starts one per task. Rather than guard every write, the
writing helpers (headcount.io) and the consoles made here do nothing in a process that is not the first; an error
still reaches the terminal from any process (cli/errors.py prints it).
"""

import os

from rich.console import Console

_first = True


def first_process() -> bool:
    return _first


def set_first_process(first: bool) -> None:
    global _first
    _first = first


def launched_as_secondary() -> bool:
    """Whether whoever started this process made it one of a job's extra processes: Lightning's DDP launcher sets
    LOCAL_RANK (1, 2, ...) for the processes it adds, SLURM and torchrun give every process its rank, and on the
    nodes after the first every process is an extra one."""
    ranks = (os.environ.get(key, "0") for key in ("RANK", "LOCAL_RANK", "SLURM_PROCID", "NODE_RANK", "GROUP_RANK"))
    return any(rank.strip() not in ("", "0") for rank in ranks)


def console() -> Console:
    """A console on stderr that is silent in every process but the first."""
    return Console(stderr=True, quiet=not _first)
