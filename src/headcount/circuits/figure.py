"""A circuit drawn as a graph: layers as rows (emb at the bottom, the logits at the top), a layer's heads side by side
with its MLP above them, one arrow per edge, coloured by the input it enters (a head's q, k or v, or an MLP / the
logits) and as wide as its weight (|score|, scaled to the largest), dashed where the weight is negative (an edge whose
removal makes the metric better, when weights are signed as damage: not a carrier of the behaviour). Arrows into a head
end at three points of it, q left, k centre, v right, so a reader sees which input each edge feeds. Every node of the
model is drawn, those the circuit uses solid and the rest faint. Each arrow carries its edge's name as its gid, so what
was drawn can be read back. Built on matplotlib's object API with the Agg canvas, as headcount's other figures: no
pyplot state."""

from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch
from torch import Tensor

from headcount.circuits.graph import Graph, Node

INPUT_COLOURS = {"q": "tab:blue", "k": "tab:orange", "v": "tab:green", "": "tab:gray"}
INPUT_OFFSETS = {"q": -0.18, "k": 0.0, "v": 0.18, "": 0.0}


def node_position(graph: Graph, node: Node) -> tuple[float, float]:
    """(x, y): heads of layer l at (h, l + 1), its MLP at (centre, l + 1.5), emb at (centre, 0), logits on top."""
    centre = (max(graph.heads_per_layer, default=1) - 1) / 2
    if node.kind == "head":
        return float(node.head), node.layer + 1.0
    if node.kind == "mlp":
        return centre, node.layer + 1.5
    return centre, 0.0 if node.kind == "emb" else graph.n_layers + 1.0


def draw_circuit(graph: Graph, edges: set[int], weights: Tensor | None = None, title: str = "") -> Figure:
    """The figure of the circuit `edges` (indices into graph.edges); weights (E,) set the arrows' widths (|weight|)
    and styles (negative: dashed)."""
    width_of = (lambda i: 1.5) if weights is None else _widths(weights, edges)
    used = {graph.edges[i].sender for i in edges} | {graph.edges[i].receiver.node for i in edges}
    nodes = graph.senders + [Node("logits", graph.n_layers)]
    fig = Figure(figsize=(1.2 * max(graph.heads_per_layer, default=1) + 2, 1.1 * graph.n_layers + 2.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for node in nodes:
        x, y = node_position(graph, node)
        alpha = 1.0 if node in used else 0.2
        ax.scatter([x], [y], s=500, color="white", edgecolor="black", alpha=alpha, zorder=3)
        ax.annotate(node.name, (x, y), ha="center", va="center", fontsize=7, alpha=alpha, zorder=4)
    for i in sorted(edges):
        e = graph.edges[i]
        (x0, y0), (x1, y1) = node_position(graph, e.sender), node_position(graph, e.receiver.node)
        arrow = FancyArrowPatch(
            (x0, y0),
            (x1 + INPUT_OFFSETS[e.receiver.input], y1),
            arrowstyle="-|>",
            mutation_scale=10,
            color=INPUT_COLOURS[e.receiver.input],
            linewidth=width_of(i),
            linestyle="--" if weights is not None and float(weights[i]) < 0 else "-",
            connectionstyle="arc3,rad=0.15",
            shrinkA=11,
            shrinkB=11,
            gid=e.name,
            zorder=2,
        )
        ax.add_patch(arrow)
    for name, colour in INPUT_COLOURS.items():
        ax.plot([], [], color=colour, label=f".{name}" if name else "MLP / logits")
    if weights is not None and any(float(weights[i]) < 0 for i in edges):
        ax.plot([], [], color="black", linestyle="--", label="removing it helps")
    ax.legend(loc="upper left", fontsize=7, frameon=False)
    ax.set_yticks(range(graph.n_layers + 2), ["emb", *[f"L{layer}" for layer in range(graph.n_layers)], "logits"])
    ax.set_xticks([])
    ax.set_xlim(-0.8, max(graph.heads_per_layer, default=1) - 0.2)
    ax.set_ylim(-0.6, graph.n_layers + 1.6)
    ax.set_title(title or f"circuit of {len(edges)} edges", fontsize=9)
    fig.tight_layout()
    return fig


def save_circuit(graph: Graph, edges: set[int], path: Path, weights: Tensor | None = None, title: str = "") -> Path:
    """draw_circuit saved as a PNG at path."""
    fig = draw_circuit(graph, edges, weights, title)
    fig.savefig(path, dpi=120)
    return Path(path)


def _widths(weights: Tensor, edges: set[int]):
    largest = max((abs(float(weights[i])) for i in edges), default=1.0) or 1.0
    return lambda i: 0.5 + 3.5 * abs(float(weights[i])) / largest
