"""How many weight rows (or path-patching pairs) and examples one pass of the circuits core holds, sized to a memory
budget: the bytes of activations per pass that `ablation.memory_budget_mb` sets for every scan (default: the
evaluator's, headcount.model.memory.default_memory_budget).

A pass over R rows and E examples holds about E * (example + R * unit) bytes: `unit` what one row of one example
holds (its copy of the senders' outputs, every receiver input of the layer at work, the logits at its score points;
with gradients every layer's, as autograd keeps them), `example` what one example holds whatever the rows (its
clean and corrupted runs' outputs). As the evaluator does, examples come first (as many as fit with one row), then
as many rows as fit beside them. Every count is a generous estimate, not a measurement (tests check the estimate
against the bytes a pass really allocates).

Splitting is exact: each point's metric value is the same computation whatever the pass holds, results are summed
over all points in point order (metric.py), and gradients are sums over examples, added in float64 in example order.
"""

from dataclasses import dataclass

from headcount.circuits.graph import Graph
from headcount.model.memory import default_memory_budget
from headcount.model.transformer import Transformer


@dataclass(frozen=True)
class PassPlan:
    rows: int  # weight rows (path patching: pairs) per pass
    examples: int  # examples per pass
    unit_bytes: int  # one row of one example
    example_bytes: int  # one example, whatever the rows

    @property
    def bytes(self) -> int:
        """The estimated activations of the largest pass."""
        return self.examples * (self.example_bytes + self.rows * self.unit_bytes)

    def example_chunks(self, n_examples: int) -> list[slice]:
        return [slice(i, min(i + self.examples, n_examples)) for i in range(0, n_examples, self.examples)]

    def row_chunks(self, n_rows: int) -> list[slice]:
        return [slice(i, min(i + self.rows, n_rows)) for i in range(0, n_rows, self.rows)]


def plan_passes(
    unit_bytes: int, example_bytes: int, n_rows: int, n_examples: int, budget: int, rows: int | None = None
) -> PassPlan:
    """As many examples as fit the budget with one row, then as many rows as fit beside them (or `rows`, as given,
    with the examples that fit beside them); at least one of each."""
    if rows is not None:
        rows = max(1, min(rows, n_rows))
        examples = max(1, min(n_examples, budget // (example_bytes + rows * unit_bytes)))
        return PassPlan(rows, examples, unit_bytes, example_bytes)
    examples = max(1, min(n_examples, budget // (example_bytes + unit_bytes)))
    rows = max(1, min(n_rows, (budget - examples * example_bytes) // (examples * unit_bytes)))
    return PassPlan(rows, examples, unit_bytes, example_bytes)


def budget_of(model: Transformer, memory_budget: int | None) -> int:
    return memory_budget if memory_budget is not None else default_memory_budget(model)


def outputs_floats(model: Transformer, T: int) -> int:
    """One example's sender outputs (NodeOutputs): the embedding, every layer's z and MLP output."""
    C = model.cfg.d_model
    per_layer = sum(block.attn.z_floats() + (C if block.mlp is not None else 0) for block in model.blocks)
    return T * (C + per_layer)


def layer_floats(model: Transformer, graph: Graph, layer: int, T: int, receivers: int) -> int:
    """What one example of one row holds while layer `layer`'s heads read `receivers` inputs of their own (3 per
    head in the edge-patched forward, 0 where they read the stream as it is) and its MLP runs: the inputs as they are
    summed (three copies), each sender layer's per-head terms, a post-norm's per-receiver mix, the inputs' norms and
    projections (OLMo 2's whole projection per input), the attention and the MLP."""
    block, C = model.blocks[layer], model.cfg.d_model
    attn = block.attn
    per_position = 3 * receivers * C + block.activation_floats(T)
    per_position += 2 * max((b.attn.n_heads * C for b in model.blocks[:layer]), default=0)
    if any(b.attention_post_norm for b in model.blocks[:layer]):
        per_position += receivers * (max(b.attn.z_floats() for b in model.blocks[:layer]) + 3 * C)
    if receivers:
        per_position += receivers * C + 2 * receivers * attn.z_floats()
        per_position += receivers * attn.input_projection_floats()
    weights = receivers * graph.sender_start(layer) + graph.n_senders(graph.receivers[-1])
    return T * per_position + weights


def points_floats(model: Transformer, points: int) -> int:
    """The logits at an example's score points, with the metric's copies (log-softmax, its output)."""
    return 3 * points * model.cfg.vocab_size


def edge_unit_bytes(model: Transformer, T: int, points: int) -> int:
    """One weight row of one example in the edge-patched forward (exact scores, faithfulness): its outputs, the
    corrupted run's copy and their difference, the layer at work and the logits at its points; without attention
    post-norms also the senders' deltas stacked for the matmul mix (mixing.py), (S, T, C). (EAP's gradient run has
    its own estimate, gradients.unit_bytes.)"""
    graph = Graph.of(model)
    layers = [layer_floats(model, graph, layer, T, 3 * graph.heads_per_layer[layer]) for layer in range(graph.n_layers)]
    floats = 3 * outputs_floats(model, T) + max(layers, default=0) + 3 * T * model.cfg.d_model
    if all(block.sums_head_terms() for block in model.blocks):
        floats += len(graph.senders) * T * model.cfg.d_model
    floats += points_floats(model, points)
    return floats * next(model.parameters()).element_size()


def example_bytes(model: Transformer, T: int, runs: int = 2) -> int:
    """One example's own runs' outputs (clean, corrupted) and the plain forward that computes them."""
    sizes = model.activation_floats(T)
    floats = runs * outputs_floats(model, T) + T * (sizes.layer + 3 * sizes.resid)
    return floats * next(model.parameters()).element_size()


def path_unit_bytes(model: Transformer, T: int, points: int, receivers: int) -> int:
    """One (senders, receivers) pair of one example in path patching: its receivers' patched inputs and its change to
    the stream, the stream and its copies, the layer at work as the model runs it, the layer's receiver heads run again
    from their own inputs (at most `receivers` heads, 3 inputs each: the inputs, their norms, their projections (OLMo
    2's whole projection per input), the scores) and the logits at its points."""
    C, sizes = model.cfg.d_model, model.activation_floats(T)
    heads = min(receivers, max((b.attn.n_heads for b in model.blocks), default=0))
    per_head = 2 * T + 6 * C + max(_projection_floats(b.attn) for b in model.blocks)
    floats = T * ((receivers + 5) * C + sizes.layer + 2 * sizes.z + heads * per_head) + points_floats(model, points)
    return floats * next(model.parameters()).element_size()


def _projection_floats(attn) -> int:
    """A receiver head's q, k, v and their rotated or normed copies per position; where the q/k norm spans the whole
    projection (OLMo 2), each of its 3 inputs runs through all of it."""
    return 3 * 2 * attn.input_projection_floats() or 3 * 3 * attn.head_dim


def path_example_bytes(model: Transformer, T: int) -> int:
    """One example's own runs in path patching, whatever the pairs: the clean and corrupted outputs, their difference,
    the clean streams into the receivers and the clean attention of post-norm layers (at most one more run's worth),
    and the plain forward that computes them."""
    return example_bytes(model, T, runs=4)
