"""The training DataLoader, resumable mid-epoch: a run restarted from a checkpoint draws the batches the
uninterrupted run would have drawn next, in the same order.

Lightning saves the `state_dict` of a training loader that has one in every checkpoint and hands it back to
`load_state_dict` on resume, before the first batch is drawn (its loops count the batches already seen; the loader
must not serve them again). The state is the shuffling generator's state where the current pass over the data began
drawing its permutation, and the number of batches served since: on resume the pass's permutation is drawn again from
that state and the batches already served are skipped as indices, without loading them.

An uninterrupted run sees exactly the order of `DataLoader(shuffle=True, drop_last=True, generator=g)`, whose passes
share the generator g with the DataLoader's own per-pass draw of a base seed for its workers (made before the
permutation, and on a persistent-workers loader only on the first pass). The generator is set right before the
permutation is drawn, so the base seed of a resumed first pass may differ from the uninterrupted run's; it only seeds
worker processes, and the data pipeline draws no random numbers.
"""

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler


class ResumableBatchSampler(BatchSampler):
    """A BatchSampler whose next pass can start part way through: `resume_at` sets the shuffling generator to the
    state an interrupted pass started from and leaves out the batches that pass served (their indices are still drawn,
    so the generator advances as in a full pass). Lightning rebuilds it around a DistributedSampler under DDP, which it
    can because the constructor is BatchSampler's; that sampler shuffles by epoch number, without a generator."""

    def __init__(self, sampler: Any, batch_size: int, drop_last: bool):
        super().__init__(sampler, batch_size, drop_last)
        self.generator: torch.Generator | None = getattr(sampler, "generator", None)
        self.pass_start: torch.Tensor | None = None  # the generator's state before this pass drew its permutation
        self._resume: tuple[torch.Tensor | None, int] | None = None

    def resume_at(self, generator_state: torch.Tensor | None, batches: int) -> None:
        self._resume = (generator_state, batches)

    def __iter__(self) -> Iterator[list[int]]:
        skip = 0
        if self._resume is not None:
            (state, skip), self._resume = self._resume, None
            if state is not None and self.generator is not None:
                self.generator.set_state(state)
        self.pass_start = self.generator.get_state() if self.generator is not None else None
        for index, batch in enumerate(super().__iter__()):
            if index >= skip:
                yield batch


class ResumableLoader(DataLoader):
    """A DataLoader (with a ResumableBatchSampler) whose state_dict says where in the shuffled data the run is. The
    constructor is DataLoader's, so Lightning can rebuild it with another sampler under DDP."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._served: int | None = None  # batches served in the current pass; None before the first pass
        self._resume: dict | None = None

    def __iter__(self) -> Iterator[Any]:
        self._served = 0
        if self._resume is not None:
            self._served = self._resume["batches"]
            self.batch_sampler.resume_at(self._resume["generator"], self._resume["batches"])
            self._resume = None
        for batch in super().__iter__():
            self._served += 1
            yield batch

    def state_dict(self) -> dict:
        sampler: ResumableBatchSampler = self.batch_sampler
        if self._served is not None and self._served < len(self):
            return {"generator": sampler.pass_start, "batches": self._served}
        # The pass is over, or none began: the next one starts from the generator as it is now, once a new iterator
        # has drawn its base seed from it (every pass, except the later ones of persistent workers).
        generator = sampler.generator
        if generator is None:
            return {"generator": None, "batches": 0}
        following = torch.Generator().set_state(generator.get_state())
        if self._served is None or not self.persistent_workers:
            torch.empty((), dtype=torch.int64).random_(generator=following)
        return {"generator": following.get_state(), "batches": 0}

    def load_state_dict(self, state: dict) -> None:
        self._resume = state


def resumable_loader(dataset: Dataset, batch_size: int, seed: int, **kwargs: Any) -> ResumableLoader:
    """Shuffled batches of `batch_size` (the last, incomplete one dropped), in an order fixed by `seed`."""
    generator = torch.Generator().manual_seed(seed)
    batches = ResumableBatchSampler(RandomSampler(dataset, generator=generator), batch_size, drop_last=True)
    return ResumableLoader(dataset, batch_sampler=batches, generator=generator, **kwargs)
