"""Joining the processes of a job that spans nodes, with a deadline.

A job whose nodes are started by hand (MASTER_ADDR, MASTER_PORT and NODE_RANK on each) waited torch.distributed's
default 30 minutes, saying nothing, when a node never came. Here the join waits `trainer.rendezvous_timeout_s` seconds,
then ends in one line naming who did not come and where they were awaited (a ConfigError: exit code 2, the run's lock
released). Once every process has joined, collectives get torch's default timeout back: a process that waits for a
slower one at an all-reduce (a scan's share of masks, a checkpoint written by the first process) is not cut short.
"""

import os
import re
from datetime import timedelta

import torch.distributed as dist
from lightning.pytorch.strategies import DDPStrategy
from torch.distributed import distributed_c10d

from headcount.config.train import TrainerConfig
from headcount.errors import ConfigError

KEY = "trainer.rendezvous_timeout_s"
DDP_NAMES = ("auto", "ddp")  # the strategies a multi-node job resolves to DDP from (trainer=ddp names "ddp")


class BoundedRendezvous(DDPStrategy):
    """Lightning's DDP strategy, whose process group is joined within `timeout_s` seconds."""

    def __init__(self, timeout_s: int, num_nodes: int, **kwargs) -> None:
        super().__init__(timeout=timedelta(seconds=timeout_s), **kwargs)
        self.timeout_s, self.nodes = timeout_s, num_nodes

    def setup_distributed(self) -> None:
        try:
            super().setup_distributed()
        except dist.DistError as error:
            raise ConfigError("trainer.num_nodes", self.nodes, self.who_did_not_come(error)) from None
        collectives = distributed_c10d._get_default_timeout(dist.get_backend())
        distributed_c10d._set_pg_timeout(collectives)
        distributed_c10d._get_default_store().set_timeout(collectives)

    def who_did_not_come(self, error: Exception) -> str:
        """One line: which processes were missing at MASTER_ADDR:MASTER_PORT after the deadline, from this node's
        side (its NODE_RANK), and how to proceed."""
        where = f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"
        node, world = os.environ.get("NODE_RANK", "?"), self.world_size
        waited = f"within {KEY}={self.timeout_s} s"
        how = f"start each node with the same MASTER_ADDR and MASTER_PORT and its own NODE_RANK, or raise {KEY}"
        if joined := re.search(r"(\d+)/(\d+) clients joined", str(error)):
            came = int(joined.group(1))
            here = self.num_processes
            missing = (
                f"no other node came (NODE_RANK 1 to {self.nodes - 1})"
                if came <= here
                else f"{world - came} of the other nodes' processes did not come"
            )
            return f"{came} of the job's {world} processes joined at {where} {waited}: {missing}; {how}"
        if isinstance(error, dist.DistNetworkError):
            return f"this node (NODE_RANK={node}) reached no rendezvous at {where} {waited}: node 0 is not there; {how}"
        return f"the job's {world} processes did not all join at {where} {waited} ({str(error).splitlines()[0]}); {how}"


def strategy_for(t: TrainerConfig, strategy: str) -> str | DDPStrategy:
    """The strategy a Trainer gets: `strategy` as it is, but DDP joined within the deadline for a job over several
    nodes."""
    if t.num_nodes > 1 and strategy in DDP_NAMES:
        return BoundedRendezvous(t.rendezvous_timeout_s, t.num_nodes)
    return strategy
