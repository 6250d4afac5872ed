"""Edge pruning (Bhaskar et al. 2024, "Finding Transformer Circuits with Edge Pruning"): a learned hard-concrete mask
on every edge of the circuits graph, the edge counterpart of the L0 head gates (l0_gates.py, whose hard-concrete
sampling and expected L0 it uses).

Each edge e has a learnable log_alpha_e; a step samples one mask m in [0, 1]^E (m = clamp(sigmoid((log u - log(1 -
u) + log_alpha) / beta) (zeta - gamma) + gamma, 0, 1), exact 0s and 1s with positive probability) and runs the
edge-patched forward (circuits/forward.py) at edge weights a = 1 - m: each receiver's input is interpolated between
its senders' clean and corrupted outputs, x_r = sum_s out_s + (1 - m_{s->r}) (out'_s - out_s), the mode's corrupted
run as every edge scan has it. The model's weights stay frozen. The loss is

    task + lambda_1 (d - d_t) + lambda_2 (d - d_t)^2,

task the KL divergence of the circuit's next-token distribution from the full model's at the score points (the
paper's objective; `objective: metric`: the squared difference of the metric per point), d = mean_e P(m_e > 0) the
expected density (1 - sparsity), d_t the target density, which falls linearly from 1 to 1 - target_sparsity over
the first `target_warmup` of the steps, then stays; Adam minimises over log_alpha while lambda_1 and lambda_2 rise by
dual ascent (lambda_1 += penalty_lr (d - d_t), lambda_2 += penalty_lr (d - d_t)^2 after every step: the paper's
Lagrangian, as the L0 gates steer to a number of heads). Training runs in a Lightning Trainer (one process, the
model's device), batches of examples cycled in order, the noise from a generator seeded by `seed`: the same seed
gives the same mask, bit for bit on one machine.

Warm start (optional): log_alpha_e = log_alpha_init + warm_scale (2 r_e - 1), r_e the rank of |EAP-IG| normalised to
(0, 1] (circuits/ensemble.py), so EAP-IG's top edges start most open. The ranking is log_alpha (the same order as
P(m > 0)); an edge's score is its log_alpha above the lowest edge's, >= 0, since circuits take the top n by |score|.
The learned circuit is the edges with P(m > 0) > 1/2, the event the expected density counts.
"""

import time
from dataclasses import dataclass, replace

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader

from headcount.ablation.methods.edge_pruning_shared import shared_training
from headcount.ablation.methods.l0_gates import expected_open, sample_gates
from headcount.circuits.attribution import edge_plan, example_chunks, logits_at, outputs_at
from headcount.circuits.ensemble import rank_normalise
from headcount.circuits.forward import NodeOutputs, edge_stream
from headcount.circuits.graph import Graph
from headcount.circuits.metric import Metric, metric_at, point_values, points_mask
from headcount.config.scans import EdgePruningSettings, check_edge_pruning
from headcount.model.transformer import Transformer
from headcount.train.quiet import quiet_third_party


@dataclass
class EdgePruningResult:
    log_alpha: Tensor  # (E,) float64, in Graph.of(model).edges order
    scores: Tensor  # (E,) float64: log_alpha - min(log_alpha), the ranking as circuits read it (|score|)
    kept: Tensor  # (E,) bool: P(mask > 0) > 1/2, the learned circuit
    history: list[dict]  # per step: step, task_loss, density, target_density, lambda_1, lambda_2
    steps: int
    examples_per_step: int
    cpu_seconds: float  # the process's CPU time in training (not a result: not in any table)


def edge_pruning(
    model: Transformer,
    clean_ids_BT: Tensor,
    corrupted_ids_BT: Tensor | NodeOutputs,
    metric: Metric,
    cfg: EdgePruningSettings,
    score_positions_B: Tensor | None = None,
    warm_start_scores: Tensor | None = None,
    memory_budget: int | None = None,
    key: str = "edge_pruning",
    world=None,
) -> EdgePruningResult:
    """Train one hard-concrete mask per edge on the frozen model (module docstring). warm_start_scores: (E,) EAP-IG
    scores when cfg.warm_start (required then). Batches hold cfg.batch_size examples (None: as many as EAP's
    gradient passes fit in memory_budget bytes). The model's requires_grad flags and mode are restored afterwards.
    world: a scan's processes (ScanWorld), each step's examples shared out over them (edge_pruning_shared.py)."""
    check_edge_pruning(cfg, key)
    n_edges = len(Graph.of(model).edges)
    if cfg.warm_start and (warm_start_scores is None or tuple(warm_start_scores.shape) != (n_edges,)):
        raise ValueError(f"{key}.warm_start needs (E,) = ({n_edges},) EAP-IG scores to start from")
    points_BT = points_mask(clean_ids_BT, score_positions_B)
    plan = edge_plan(model, points_BT, 1, memory_budget, rows=1, grad=True)
    examples = cfg.batch_size or plan.examples
    batches = example_chunks(replace(plan, examples=examples), points_BT)
    param = next(model.parameters())
    init = torch.full((n_edges,), float(cfg.log_alpha_init), dtype=torch.float64)
    if cfg.warm_start:
        init = init + cfg.warm_scale * (2 * rank_normalise(warm_start_scores.double()) - 1)
    dtype = torch.promote_types(param.dtype, torch.float32)  # half-precision log_alpha would round Adam's steps away
    if world is not None:
        start = time.process_time()
        args = (clean_ids_BT, corrupted_ids_BT, points_BT, metric, cfg, batches, init.to(dtype))
        log_alpha, history = shared_training(world, model, *args)
        return learned(log_alpha.double().cpu(), history, cfg, examples, start)
    module = EdgeMasks(model, clean_ids_BT, corrupted_ids_BT, points_BT, metric, cfg, batches, init.to(dtype))
    requires_grad = [p.requires_grad for p in model.parameters()]
    was_training = model.training
    model.requires_grad_(False).eval()
    quiet_third_party()
    trainer = L.Trainer(
        accelerator="gpu" if param.device.type == "cuda" else "cpu",
        devices=[param.device.index or 0] if param.device.type == "cuda" else 1,
        max_steps=cfg.steps,
        max_epochs=-1,
        precision="32-true",  # Lightning casts nothing: log_alpha keeps its dtype, the model its own
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        use_distributed_sampler=False,
    )
    loader = DataLoader(range(len(batches)), batch_size=None, shuffle=False)
    start = time.process_time()
    try:
        trainer.fit(module, loader)
    finally:
        for p, flag in zip(model.parameters(), requires_grad):
            p.requires_grad_(flag)
        model.train(was_training)
    return learned(module.log_alpha.detach().double().cpu(), module.history, cfg, examples, start)


def learned(
    log_alpha: Tensor, history: list[dict], cfg: EdgePruningSettings, examples: int, start: float
) -> EdgePruningResult:
    return EdgePruningResult(
        log_alpha=log_alpha,
        scores=log_alpha - log_alpha.min(),
        kept=expected_open(log_alpha, cfg) > 0.5,
        history=history,
        steps=cfg.steps,
        examples_per_step=examples,
        cpu_seconds=time.process_time() - start,
    )


def kl_from_full(full_logprobs_PV: Tensor, logits_PV: Tensor) -> Tensor:
    """The mean over points of KL(full || circuit) = sum_v p_full (log p_full - log p_circuit), in float64."""
    circuit_PV = F.log_softmax(logits_PV.double(), -1)
    return (full_logprobs_PV.exp() * (full_logprobs_PV - circuit_PV)).sum(-1).mean()


class EdgeMasks(L.LightningModule):
    """The masks' log_alpha (E,) and the Lagrangian; the frozen model is held as a plain attribute (not a submodule:
    Lightning neither moves, saves nor optimises it)."""

    def __init__(
        self,
        model: Transformer,
        clean_ids_BT: Tensor,
        corrupted: Tensor | NodeOutputs,
        points_BT: Tensor,
        metric: Metric,
        cfg: EdgePruningSettings,
        batches: list[tuple[slice, slice]],
        init_E: Tensor,
    ):
        super().__init__()
        self.__dict__["frozen"] = model
        self.cfg, self.batches, self.metric, self.points_BT = cfg, batches, metric, points_BT
        self.log_alpha = nn.Parameter(init_E.to(next(model.parameters()).device))
        self.generator = torch.Generator(device=self.log_alpha.device).manual_seed(cfg.seed)
        self.lambda_1, self.lambda_2 = 0.0, 0.0
        self.warmup_steps = max(1, round(cfg.target_warmup * cfg.steps))
        self.history: list[dict] = []
        # per batch, computed once: the clean embedding, the corrupted run's outputs and the full model's targets
        self.emb, self.corrupted, self.targets = [], [], []
        with torch.no_grad():
            for examples, columns in batches:
                emb = model.embed(clean_ids_BT[examples])
                self.emb.append(emb)
                self.corrupted.append(outputs_at(model, corrupted, examples))
                stream, _ = edge_stream(model, emb)
                logits_PV = logits_at(model, stream, points_BT[examples])
                if cfg.objective == "kl":
                    self.targets.append(F.log_softmax(logits_PV[0].double(), -1))
                else:
                    self.targets.append(point_values(logits_PV, metric_at(metric, columns))[0])

    def configure_optimizers(self):
        return torch.optim.Adam([self.log_alpha], lr=self.cfg.lr)

    def target_density(self, step: int) -> float:
        return 1 - self.cfg.target_sparsity * min(1.0, (step + 1) / self.warmup_steps)

    def training_step(self, batch: int, batch_idx: int) -> Tensor:
        model, cfg = self.frozen, self.cfg
        examples, columns = self.batches[batch]
        mask_1E = sample_gates(self.log_alpha, 1, cfg, self.generator)
        emb = self.emb[batch]
        stream, _ = edge_stream(model, emb, (1 - mask_1E).to(emb.dtype), self.corrupted[batch])
        logits_PV = logits_at(model, stream, self.points_BT[examples])
        if cfg.objective == "kl":
            task = kl_from_full(self.targets[batch], logits_PV[0])
        else:
            values_P = point_values(logits_PV, metric_at(self.metric, columns))[0]
            task = ((values_P - self.targets[batch]) ** 2).mean()
        density = expected_open(self.log_alpha, cfg).mean()
        target_density = self.target_density(self.global_step)
        violation = density - target_density
        loss = task + self.lambda_1 * violation + self.lambda_2 * violation**2
        self.violation = violation.item()
        self.history.append(
            dict(
                step=self.global_step,
                task_loss=task.item(),
                density=density.item(),
                target_density=target_density,
                lambda_1=self.lambda_1,
                lambda_2=self.lambda_2,
            )
        )
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        """Dual ascent on the multipliers, after the step on log_alpha."""
        self.lambda_1 += self.cfg.penalty_lr * self.violation
        self.lambda_2 += self.cfg.penalty_lr * self.violation**2
