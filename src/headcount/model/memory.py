"""The activation memory one pass may hold by default: the budget the evaluator (ablation/engine/evaluator.py) and
the circuits core (circuits/passes.py) both size their passes to, unless `ablation.memory_budget_mb` sets it."""

import torch

from headcount.model.transformer import Transformer

CPU_MEMORY_BUDGET = 64 * 2**20  # bytes of activations per pass, at least
CUDA_FREE_MEMORY_SHARE = 0.5


def default_memory_budget(model: Transformer) -> int:
    """Half the free CUDA memory; on CPU, CPU_MEMORY_BUDGET or the weights' size, whichever is larger (every pass
    reads the weights, so a smaller pass would not make a large model cheaper to run)."""
    param = next(model.parameters())
    if param.device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(param.device)
        return int(free * CUDA_FREE_MEMORY_SHARE)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    return max(CPU_MEMORY_BUDGET, weight_bytes)
