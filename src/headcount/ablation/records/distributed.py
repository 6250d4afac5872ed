"""One scan over many processes: Lightning's DDP strategy runs the mask evaluator's work in its predict loop, each
process takes a share of the masks, and the per-mask sums are reduced once at the end.

The trainer section (the one training reads: trainer=ddp, trainer.devices, trainer.num_nodes, and SLURM's tasks
through hydra/launcher=slurm) decides how many processes a scan runs in. With one, the evaluator runs in the process as
always. With more, every process runs the same session in lockstep (the processes Lightning's launcher adds rerun the
command, SLURM starts one per task): each builds the model, the evaluation set and the evaluator itself, and only the
first writes files (headcount.processes). A mask evaluation (Scan.evaluate) is then one `Trainer.predict` call over
the eval batches, in which:

- the processes check that they evaluate the same thing (the partial file's fingerprint, gathered from each), and the
  first reads the partial files an interrupted run left (one per process, merged: each mask's furthest row) and
  hands their sums to the others;
- the masks are shared out whole: the one-process pass plan (masks grouped by the first layer they touch, in passes
  of masks_per_pass) is cut into its passes, and each pass goes to the process with the least work so far (a pass
  costs its masks' remaining batches times the layers it runs). A mask's sums are therefore computed by one process,
  with the same passes and in the same batch order as in one process: bit for bit the same numbers at the same
  thread count;
- each predict step is one eval batch: its clean pass, then this process's passes (MaskEvaluator.accumulate_batch),
  with the process's own partial file kept up to date (`<scan>.partial.rank<r>.csv`);
- at the end, one all-reduce adds the processes' (M, K) float64 sums, batch counts and score points; a mask owned by
  another process is all zeros here, so every process ends with exactly the owner's numbers.

Edge scans (path patching, edge attribution's exact, EAP and EAP-IG scores and its faithfulness curve) share
examples rather than masks (`ScanWorld.per_example`): each process evaluates a contiguous share of the examples
(circuits/shares.py), every result one float64 row per example, and one all-reduce of the (examples, ...) tables,
zero outside each process's rows, gives every process the table of all examples (x + 0 is x: the rows as their
process computed them). The scores are then their sums over examples, in example order, as in one process.

Processes whose memory budgets fit different batch sizes (GPUs with different free memory) are refused in one line
(set ablation.memory_budget_mb); different masks per pass agree on the smallest. Ctrl-C, which Lightning turns into
exit(1), leaves as KeyboardInterrupt, as it does in one process. Scans that do not evaluate masks (attribution's
gradients, importance, L0 gates, head scores) run whole in every process, with the same numbers; only the first writes
them.
"""

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import torch
from lightning.fabric.utilities.exceptions import MisconfigurationException
from torch import Tensor
from torch.utils.data import DataLoader

from headcount.ablation.engine.evaluator import MaskEvaluator, MaskSet, MaskTotals
from headcount.ablation.engine.masks import HeadMask, masks_to_gates
from headcount.ablation.records.resumable import PartialSaver, load_partials, mask_positions, partial_key, rank_partial
from headcount.circuits.shares import example_share
from headcount.config.train import TrainerConfig
from headcount.errors import ConfigError
from headcount.processes import first_process
from headcount.train.quiet import quiet_third_party
from headcount.train.rendezvous import strategy_for

SCAN_STRATEGIES = ("auto", "ddp")  # a scan's processes run the command in lockstep: DDP's launchers, not spawn
SCAN_ACCELERATORS = ("auto", "cpu", "gpu", "cuda")


def evaluate_resumably(
    evaluator: MaskEvaluator,
    masks: list[HeadMask],
    partial: Path,
    key: str,
    label: str,
    show_progress: bool,
    positions: list[str] = (),
    world: "ScanWorld | None" = None,
) -> MaskTotals:
    """Evaluate the masks, starting from the partial files saved under the same key if there are any, and keeping
    the partial file up to date as passes finish. positions: the named positions masks may name (the columns of
    named_pos). world: the processes to share the masks out over (below), None for this one. The
    caller writes the final results and deletes the partial files."""
    key = partial_key(evaluator, masks, key)
    gates_MLH = masks_to_gates(masks, evaluator.model.heads_per_layer)
    mask_set = evaluator.mask_set(gates_MLH, mask_positions(masks, positions))
    if world is not None:
        return world.evaluate(evaluator, masks, mask_set, partial, key, label, show_progress)
    totals = load_partials(partial, key, masks, evaluator.columns) or MaskTotals.empty(len(masks), evaluator.columns)
    keep_examples(totals, evaluator.n_examples)
    n_batches = len(evaluator.batches)
    with PartialSaver(partial, key, masks, f"{label}: {len(masks)} masks", n_batches, show_progress) as saver:
        saver.begin(totals)
        for b in range(n_batches):
            evaluator.accumulate_batch(b, mask_set, totals, saver)
    return totals


def keep_examples(totals: MaskTotals, n_examples: int) -> None:
    """Keep each example's sums (the bootstrap's units): from the start, or from partial files that kept them; not
    for an evaluation resumed from files that hold sums only (written before they kept them)."""
    if not bool(totals.batches_done.any()):
        totals.examples = torch.zeros(len(totals.sums), n_examples, dtype=torch.float64)
    elif totals.examples is not None and totals.examples.shape[1] != n_examples:
        totals.examples = None


@dataclass
class ScanWorld:
    """The processes a scan runs in, through one Lightning Trainer that every mask evaluation reuses."""

    trainer: L.Trainer
    reduce_seconds: float = 0.0  # how long the last evaluation's reduction took

    @property
    def size(self) -> int:
        return self.trainer.world_size

    @property
    def rank(self) -> int:
        return self.trainer.global_rank

    @property
    def device(self) -> torch.device:
        return self.trainer.strategy.root_device

    def evaluate(
        self,
        evaluator: MaskEvaluator,
        masks: list[HeadMask],
        mask_set: MaskSet,
        partial: Path,
        key: str,
        label: str,
        show_progress: bool,
    ) -> MaskTotals:
        """evaluate_resumably's work shared out over the processes, each of which calls this with the same masks and
        ends with every mask's totals: one run of Lightning's predict loop over the eval batches' indices (every
        process sees every batch, for its own masks: no distributed sampler)."""
        evaluation = SharedEvaluation(self, evaluator, masks, mask_set, partial, key, label, show_progress)
        loader = DataLoader(range(len(evaluator.batches)), batch_size=None)
        try:
            self.trainer.predict(MaskShare(evaluation), dataloaders=loader, return_predictions=False)
        except SystemExit:
            if self.trainer.interrupted:  # Lightning turns Ctrl-C into exit(1): the commands say it as for one process
                raise KeyboardInterrupt from None
            raise
        return evaluation.totals

    def per_example(self, n_examples: int, compute: "PerExample") -> dict[str, Tensor]:
        """compute(examples) -> {name: (examples, ...) float64} for every example, each process computing its share
        (one run of Lightning's predict loop, so that its launcher starts the processes as for a mask evaluation):
        the tables of all examples, equal in every process."""
        evaluation = ExampleEvaluation(self, n_examples, compute)
        try:
            self.trainer.predict(ExampleShareModule(evaluation), dataloaders=DataLoader([0]), return_predictions=False)
        except SystemExit:
            if self.trainer.interrupted:
                raise KeyboardInterrupt from None
            raise
        return evaluation.tables

    def together(self, work: Callable[[], None]) -> None:
        """work() in every process at once, with gradients on, as one run of Lightning's predict loop (its launcher
        starts the processes as for a mask evaluation): work that shares itself out and reduces across the processes
        (edge pruning's steps, ablation/methods/edge_pruning_shared.py)."""
        try:
            self.trainer.predict(Together(work), dataloaders=DataLoader([0]), return_predictions=False)
        except SystemExit:
            if self.trainer.interrupted:
                raise KeyboardInterrupt from None
            raise


class Together(L.LightningModule):
    """ScanWorld.together's work as the one predict step of every process."""

    def __init__(self, work: Callable[[], None]):
        super().__init__()
        self.work = work

    def predict_step(self, batch: int, batch_idx: int) -> None:
        with torch.enable_grad():
            self.work()


PerExample = Callable[[slice], dict[str, Tensor]]


def per_example_tables(world: "ScanWorld | None", n_examples: int, compute: PerExample) -> dict[str, Tensor]:
    """compute's per-example tables of all n_examples: in this process alone, or shared out over the world's."""
    if world is None:
        return {name: table.double().cpu() for name, table in compute(slice(0, n_examples)).items()}
    return world.per_example(n_examples, compute)


@dataclass
class ExampleEvaluation:
    """One per-example evaluation, this process's share of it: what ExampleShareModule's hooks run."""

    world: ScanWorld
    n_examples: int
    compute: PerExample

    def run(self) -> None:
        world = self.world
        share = example_share(self.n_examples, world.size, world.rank)
        mine = {} if share.start == share.stop else {k: v.double().cpu() for k, v in self.compute(share).items()}
        shapes = [None] * world.size  # a process with no example has no table to read the shapes from
        torch.distributed.all_gather_object(shapes, {k: tuple(v.shape[1:]) for k, v in mine.items()} or None)
        known = next(s for s in shapes if s is not None)
        tables = {k: torch.zeros(self.n_examples, *shape, dtype=torch.float64) for k, shape in known.items()}
        for name, table in mine.items():
            tables[name][share] = table
        started = time.perf_counter()
        packed = torch.cat([t.flatten() for t in tables.values()]).to(world.device)
        torch.distributed.all_reduce(packed)
        world.reduce_seconds = time.perf_counter() - started
        values = packed.cpu().split([t.numel() for t in tables.values()])
        self.tables = {k: v.view(tables[k].shape) for k, v in zip(tables, values)}


class ExampleShareModule(L.LightningModule):
    """A per-example evaluation as Lightning's predict loop runs it: one predict step, this process's share, with
    gradients on (EAP's backward; the loop turns them off)."""

    def __init__(self, evaluation: ExampleEvaluation):
        super().__init__()
        self.evaluation = evaluation

    def predict_step(self, batch: int, batch_idx: int) -> None:
        with torch.enable_grad():
            self.evaluation.run()


def devices_per_node(t: TrainerConfig) -> int:
    """How many processes trainer.devices asks for on each node (Lightning's reading of it)."""
    devices = t.devices
    if isinstance(devices, (list, tuple)) or (hasattr(devices, "__len__") and not isinstance(devices, str)):
        return len(devices)
    text = str(devices).strip()
    gpu = t.accelerator in ("gpu", "cuda") or (t.accelerator == "auto" and torch.cuda.is_available())
    if text in ("auto", "-1"):
        return torch.cuda.device_count() if gpu else 1
    if "," in text:
        return len([part for part in text.split(",") if part.strip()])
    try:
        return int(text)
    except ValueError:
        raise ConfigError("trainer.devices", devices, "allowed: a number, a list of device indices, or auto") from None


def check_scan_trainer(t: TrainerConfig, device_setting: str = "auto") -> int:
    """The number of processes the trainer section runs a scan in; ConfigError for what a scan cannot run with:
    a strategy other than DDP's, an accelerator or more devices than this machine has, an ablation.device that
    contradicts trainer.accelerator."""
    per_node = devices_per_node(t)
    if per_node == 0 and t.accelerator in ("gpu", "cuda"):  # devices=auto (trainer=ddp) where there is no GPU
        raise ConfigError("trainer.accelerator", t.accelerator, "this machine has no GPU (trainer.accelerator=cpu)")
    if per_node < 1:
        raise ConfigError("trainer.devices", t.devices, "must be at least 1")
    if t.num_nodes < 1:
        raise ConfigError("trainer.num_nodes", t.num_nodes, "must be a positive integer")
    processes = per_node * t.num_nodes
    if processes == 1:
        return 1
    if t.strategy not in SCAN_STRATEGIES:
        raise ConfigError(
            "trainer.strategy",
            t.strategy,
            "a scan over several processes runs them in lockstep through DDP; allowed: " + ", ".join(SCAN_STRATEGIES),
        )
    if t.accelerator not in SCAN_ACCELERATORS:
        raise ConfigError("trainer.accelerator", t.accelerator, "for a scan, allowed: " + ", ".join(SCAN_ACCELERATORS))
    gpu = t.accelerator in ("gpu", "cuda") or (t.accelerator == "auto" and torch.cuda.is_available())
    if gpu:
        if not torch.cuda.is_available():
            raise ConfigError("trainer.accelerator", t.accelerator, "this machine has no GPU (trainer.accelerator=cpu)")
        if per_node > torch.cuda.device_count():
            raise ConfigError("trainer.devices", t.devices, f"this machine has {torch.cuda.device_count()} GPUs")
    elif per_node > (os.cpu_count() or 1):
        raise ConfigError(
            "trainer.devices", t.devices, f"one scan process per CPU core at most: this machine has {os.cpu_count()}"
        )
    wanted = "cuda" if gpu else "cpu"
    if device_setting not in ("auto", wanted):
        raise ConfigError(
            "ablation.device",
            device_setting,
            f"a scan over {processes} processes runs on trainer.accelerator={t.accelerator}'s devices ({wanted}): "
            "leave ablation.device=auto",
        )
    return processes


def scan_world(t: TrainerConfig, device_setting: str = "auto") -> ScanWorld | None:
    """The Trainer a scan over several processes runs its evaluations through; None for one process. Building it
    launches nothing: the first evaluation does (or SLURM already has)."""
    if check_scan_trainer(t, device_setting) == 1:
        return None
    quiet_third_party()
    try:
        trainer = L.Trainer(
            accelerator=t.accelerator,
            devices=t.devices,
            num_nodes=t.num_nodes,
            strategy=strategy_for(t, "ddp"),  # over several nodes, joined within trainer.rendezvous_timeout_s
            precision="32-true",  # the evaluator's float32 (float64 sums), whatever training used
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,  # headcount's own bar, in the first process
            enable_model_summary=False,
            use_distributed_sampler=False,
            inference_mode=False,  # the evaluator runs under no_grad and adds to sums made outside the loop
        )
    except (MisconfigurationException, ValueError, RuntimeError) as error:
        raise ConfigError("trainer", f"devices={t.devices}", str(error).strip().splitlines()[0]) from None
    return ScanWorld(trainer)


def share_masks(
    start_M: Tensor, remaining_M: Tensor, masks_per_pass: int, layers_run: Callable[[int], int], size: int
) -> Tensor:
    """(M,) the process each mask goes to: the one-process pass plan's passes, largest first, each to the process
    with the least work so far (ties to the lowest rank), so every process runs whole passes of that plan. A pass
    costs its masks' remaining batches times layers_run(its start) (the evaluator's: its one stack's layers from
    `start`, or an encoder-decoder's stacks)."""
    passes: list[tuple[float, Tensor]] = []
    for start in start_M.unique().tolist():
        for index in (start_M == start).nonzero().squeeze(1).split(masks_per_pass):
            passes.append((float(remaining_M[index].sum()) * layers_run(start), index))
    owner_M = torch.zeros(len(start_M), dtype=torch.int64)
    load = [0.0] * size
    for cost, index in sorted(passes, key=lambda p: -p[0]):  # sorted is stable: ties keep the plan's order
        rank = min(range(size), key=lambda r: (load[r], r))
        owner_M[index] = rank
        load[rank] += cost
    return owner_M


def reduce_totals(
    sums: Tensor, batches_done: Tensor, n_targets: Tensor, device: torch.device, into: MaskTotals | None = None
) -> None:
    """Sum each process's (M, K) sums and (M,) counts in place, in one all-reduce of one float64 tensor; `into`:
    sums are its sums beside its examples' columns, both written back there."""
    packed = torch.cat([sums, batches_done[:, None].double(), n_targets[:, None].double()], dim=1).to(device)
    torch.distributed.all_reduce(packed)
    packed = packed.cpu()
    if into is not None:
        K = into.sums.shape[1]
        into.sums.copy_(packed[:, :K])
        into.examples.copy_(packed[:, K:-2])
    else:
        sums.copy_(packed[:, :-2])
    batches_done.copy_(packed[:, -2].round().long())
    n_targets.copy_(packed[:, -1].round().long())


@dataclass
class SharedEvaluation:
    """One mask evaluation, this process's part of it: what MaskShare's hooks run."""

    world: ScanWorld
    evaluator: MaskEvaluator
    masks: list[HeadMask]
    mask_set: MaskSet
    partial: Path
    key: str
    label: str
    show_progress: bool

    def start(self) -> None:
        """Agree on what is evaluated, take up the saved sums (read by the first process) and this process's share."""
        world, evaluator = self.world, self.evaluator
        columns = evaluator.columns
        sizes = [None] * world.size
        torch.distributed.all_gather_object(sizes, (evaluator.batch_size, evaluator.masks_per_pass, self.key))
        batch_sizes, passes = {size[0] for size in sizes}, {size[1] for size in sizes}
        if len(batch_sizes) > 1:  # GPUs with different free memory sized their batches differently
            raise ConfigError(
                "ablation.memory_budget_mb",
                None,
                f"the scan's processes fit different batch sizes ({sorted(batch_sizes)}) in their memory: set "
                "ablation.memory_budget_mb (or ablation.masks_per_pass) so that they agree",
            )
        evaluator.masks_per_pass = min(passes)  # the same pass plan everywhere
        if len({size[2] for size in sizes}) > 1:  # a session that differs between processes: never mix their numbers
            raise RuntimeError(f"{self.label}: the scan's processes evaluate different things ({sizes})")
        saved = [load_partials(self.partial, self.key, self.masks, columns) if world.rank == 0 else None]
        torch.distributed.broadcast_object_list(saved, src=0)
        self.totals = saved[0] or MaskTotals.empty(len(self.masks), columns)
        keep_examples(self.totals, evaluator.n_examples)
        n_batches = len(self.evaluator.batches)
        remaining_M = n_batches - self.totals.batches_done
        owner_M = share_masks(
            self.mask_set.start_M, remaining_M, self.evaluator.masks_per_pass, self.evaluator.layers_run, world.size
        )
        self.owned = (owner_M == world.rank).nonzero().squeeze(1)
        t = self.totals
        examples = None if t.examples is None else t.examples[self.owned]
        self.share = MaskTotals(
            t.batches_done[self.owned], t.sums[self.owned], t.n_targets[self.owned], columns, examples
        )
        self.share_set = self.mask_set.subset(self.owned)
        share_masks_ = [self.masks[i] for i in self.owned.tolist()]
        what = f"{self.label}: {len(self.owned)} of {len(self.masks)} masks (process {world.rank + 1} of {world.size})"
        path = rank_partial(self.partial, world.rank)
        show = self.show_progress and first_process()
        self.saver = PartialSaver(path, self.key, share_masks_, what, n_batches, show).__enter__()
        self.saver.begin(self.share)

    def step(self, b: int) -> None:
        self.evaluator.accumulate_batch(b, self.share_set, self.share, self.saver)

    def finish(self) -> None:
        """Every mask's totals in every process: the owners' sums, added up once."""
        self.saver.save(self.share)
        self.saver.__exit__()
        kept = self.share.examples is not None
        t = MaskTotals.empty(len(self.masks), self.evaluator.columns, self.evaluator.n_examples if kept else None)
        t.batches_done[self.owned], t.sums[self.owned], t.n_targets[self.owned] = (
            self.share.batches_done,
            self.share.sums,
            self.share.n_targets,
        )
        started = time.perf_counter()
        if kept:  # each example's sums travel with the sums: one all-reduce of one float64 tensor
            t.examples[self.owned] = self.share.examples
            reduce_totals(torch.cat([t.sums, t.examples], 1), t.batches_done, t.n_targets, self.world.device, t)
        else:
            reduce_totals(t.sums, t.batches_done, t.n_targets, self.world.device)
        self.world.reduce_seconds = time.perf_counter() - started
        self.totals = t


class MaskShare(L.LightningModule):
    """A mask evaluation as Lightning's predict loop runs it: one predict step per eval batch. The evaluator is held
    as a plain attribute, not a submodule: the loop moves its submodules to the CPU when it ends."""

    def __init__(self, evaluation: SharedEvaluation):
        super().__init__()
        self.evaluation = evaluation

    def on_predict_start(self) -> None:
        self.evaluation.start()

    def predict_step(self, batch: int, batch_idx: int) -> None:
        self.evaluation.step(int(batch))

    def on_predict_end(self) -> None:
        self.evaluation.finish()
