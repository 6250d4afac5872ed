"""Edge pruning (edge_pruning.py) over a scan's processes (ablation/records/distributed.py's ScanWorld): each step's
batch of examples is split into contiguous shares (circuits/shares.py's example_share), one per process, and each
process computes its share's part of the task loss, the sum over its points of the per-point loss divided by the
batch's points, and its gradient on log_alpha. One all-reduce (float64) adds the processes' gradients and task sums:
the batch's mean loss and its gradient, as one process computes them. The penalty's gradient, the same in every
process, is added once, then every process takes the same Adam step and the same dual ascent: the masks' noise comes
from one generator per process seeded alike, so every process draws the same mask each step and ends with the same
log_alpha, equal to one process's up to the order of the sums (float64 1e-12: tests/test_distributed_edges.py).
"""

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from headcount.ablation.methods.l0_gates import expected_open, sample_gates
from headcount.circuits.attribution import logits_at, outputs_at
from headcount.circuits.forward import NodeOutputs, edge_stream
from headcount.circuits.metric import Metric, metric_at, point_values
from headcount.circuits.shares import example_share
from headcount.config.scans import EdgePruningSettings
from headcount.model.transformer import Transformer


def shared_training(
    world,
    model: Transformer,
    clean_ids_BT: Tensor,
    corrupted: Tensor | NodeOutputs,
    points_BT: Tensor,
    metric: Metric,
    cfg: EdgePruningSettings,
    batches: list[tuple[slice, slice]],
    init_E: Tensor,
) -> tuple[Tensor, list[dict]]:
    """(log_alpha, history) of edge pruning's steps shared over world's processes (the module docstring); batches:
    edge_pruning's (examples, their points' columns), cycled in order as one process cycles them."""
    requires_grad, was_training = [p.requires_grad for p in model.parameters()], model.training
    model.requires_grad_(False).eval()
    try:
        trained = SharedSteps(model, clean_ids_BT, corrupted, points_BT, metric, cfg, batches, init_E, world)
        world.together(trained.run)
    finally:
        for p, flag in zip(model.parameters(), requires_grad):
            p.requires_grad_(flag)
        model.train(was_training)
    return trained.log_alpha.detach(), trained.history


class SharedSteps:
    """One process's share of every batch (computed once: its clean embedding, the corrupted run's outputs, the full
    model's targets at its points) and the training loop every process runs in step."""

    def __init__(self, model, clean_ids_BT, corrupted, points_BT, metric, cfg, batches, init_E, world):
        self.model, self.cfg, self.world = model, cfg, world
        device = next(model.parameters()).device
        self.log_alpha = nn.Parameter(init_E.to(device))
        self.warmup_steps = max(1, round(cfg.target_warmup * cfg.steps))
        self.history: list[dict] = []
        self.shares = []
        with torch.no_grad():
            for examples, columns in batches:
                n = examples.stop - examples.start
                mine = example_share(n, world.size, world.rank)
                points_in_batch = int(points_BT[examples].sum())
                if mine.start == mine.stop:  # a batch smaller than the processes: no point here
                    self.shares.append((None, points_in_batch))
                    continue
                share = slice(examples.start + mine.start, examples.start + mine.stop)
                ends = [0, *points_BT[examples].sum(1).cumsum(0).tolist()]
                share_columns = slice(columns.start + ends[mine.start], columns.start + ends[mine.stop])
                emb = model.embed(clean_ids_BT[share])
                stream, _ = edge_stream(model, emb)
                logits_PV = logits_at(model, stream, points_BT[share])
                share_metric = metric_at(metric, share_columns)
                if cfg.objective == "kl":
                    target = F.log_softmax(logits_PV[0].double(), -1)
                else:
                    target = point_values(logits_PV, share_metric)[0]
                data = (emb, outputs_at(model, corrupted, share), points_BT[share], share_metric, target)
                self.shares.append((data, points_in_batch))

    def task_sum(self, data, mask_1E: Tensor) -> Tensor:
        """The share's per-point losses summed (KL from the full model, or the metric's squared error)."""
        emb, corrupted, points_BT, metric, target = data
        stream, _ = edge_stream(self.model, emb, (1 - mask_1E).to(emb.dtype), corrupted)
        logits_PV = logits_at(self.model, stream, points_BT)
        if self.cfg.objective == "kl":
            circuit_PV = F.log_softmax(logits_PV[0].double(), -1)
            return (target.exp() * (target - circuit_PV)).sum()
        return ((point_values(logits_PV, metric)[0] - target) ** 2).sum()

    def run(self) -> None:
        cfg, log_alpha = self.cfg, self.log_alpha
        optimizer = torch.optim.Adam([log_alpha], lr=cfg.lr)
        generator = torch.Generator(device=log_alpha.device).manual_seed(cfg.seed)
        lambda_1 = lambda_2 = 0.0
        for step in range(cfg.steps):
            data, n_points = self.shares[step % len(self.shares)]
            mask_1E = sample_gates(log_alpha, 1, cfg, generator)  # the same draw in every process
            optimizer.zero_grad()
            task = self.task_sum(data, mask_1E) if data is not None else log_alpha.sum() * 0.0
            task.backward()
            packed = torch.cat([log_alpha.grad.double().flatten(), task.detach().double().reshape(1)])
            packed = packed.to(self.world.device)  # where the process group reduces (NCCL: the GPU)
            torch.distributed.all_reduce(packed)  # the batch's gradient and task sum, every share added
            density = expected_open(log_alpha, cfg).mean()
            target_density = 1 - cfg.target_sparsity * min(1.0, (step + 1) / self.warmup_steps)
            violation = density - target_density
            log_alpha.grad = None
            (lambda_1 * violation + lambda_2 * violation**2).backward()
            penalty_grad = log_alpha.grad if log_alpha.grad is not None else torch.zeros_like(log_alpha)
            grad = packed[:-1].to(log_alpha.device, log_alpha.dtype) / n_points
            log_alpha.grad = grad + penalty_grad
            optimizer.step()
            task_loss = float(packed[-1]) / n_points
            self.history.append(
                dict(
                    step=step,
                    task_loss=task_loss,
                    density=density.item(),
                    target_density=target_density,
                    lambda_1=lambda_1,
                    lambda_2=lambda_2,
                )
            )
            lambda_1 += cfg.penalty_lr * violation.item()
            lambda_2 += cfg.penalty_lr * violation.item() ** 2
