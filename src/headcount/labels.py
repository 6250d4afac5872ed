"""Head labels, built and parsed here alone: a head is `L1H3` (layer 1, head 3) in masks, tables, figures, findings
and the circuits graph; a head's input is `L1H3.q` (.k, .v); an edge is `L0H1 -> L1H3.q`; a set of names in one
table cell (path_patching's receivers) is joined by ", ", a set of heads (head_circuit's kept heads) by " " and a
mask's heads by "+". Every reader of a table parses its names with the functions that wrote them.

An encoder-decoder has three kinds of heads, and its labels name the kind before the head: `enc.L1H3` (encoder
self-attention), `dec.L1H3` (decoder self-attention), `cross.L1H3` (the decoder's cross-attention to the encoder);
a one-stack model's heads (a decoder or an encoder) keep the bare `L1H3`. The same kinds key an encoder-decoder's
gates (`{"enc": (L_enc, H), "dec": (L_dec, H), "cross": (L_dec, H_cross)}`) and prefix its named sites."""

import re

Head = tuple[int, int]  # (layer, head)

HEAD = re.compile(r"L(\d+)H(\d+)")
# An encoder-decoder's head kinds: encoder self-attention, decoder self-attention, the decoder's cross-attention
HEAD_KINDS = ("enc", "dec", "cross")
KIND_NAMES = {"enc": "encoder self-attention", "dec": "decoder self-attention", "cross": "cross-attention"}
KIND_HEAD = re.compile(r"(?:([a-z]+)\.)?L(\d+)H(\d+)")
KindHead = tuple[str | None, int, int]  # (kind or None for a one-stack model's head, layer, head)
NAMES_SEPARATOR = ", "  # between the names of one table cell
HEADS_SEPARATOR = " "  # between the heads of one table cell (head_circuit's kept heads)
MASK_SEPARATOR = "+"  # between the heads of a mask's name (L0H1+L1H2)
EDGE_ARROW = "->"  # between an edge's sender and receiver


def head_label(layer: int, head: int) -> str:
    """A head's label: L1H3."""
    return f"L{int(layer)}H{int(head)}"


def parse_head(label: str) -> Head | None:
    """(layer, head) of a head's label (L1H3); None for any other text (emb, L0.mlp, L1H3.q)."""
    match = HEAD.fullmatch(str(label).strip())
    return (int(match[1]), int(match[2])) if match else None


def heads_in(text: str) -> list[Head]:
    """Every head label within a longer name, in order: a joined mask name (L0H1+L1H2), a random set's name."""
    return [(int(layer), int(head)) for layer, head in HEAD.findall(str(text))]


def split_input(label: str) -> tuple[Head, str] | None:
    """A head input's label (L1H3.q) as ((layer, head), suffix); the suffix as written, checked by the caller; None
    when the text before the dot is no head label."""
    head, dot, suffix = str(label).strip().partition(".")
    parsed = parse_head(head)
    return (parsed, suffix) if parsed is not None and dot else None


def input_label(layer: int, head: int, which: str = "") -> str:
    """A head's input label (L1H3.q), or the head's own label when `which` is empty."""
    return head_label(layer, head) + (f".{which}" if which else "")


def join_names(names: list[str]) -> str:
    """Names as one table cell: "L1H0.q, L1H1.k"."""
    return NAMES_SEPARATOR.join(names)


def split_names(cell: str) -> list[str]:
    """The names join_names wrote into one table cell."""
    return str(cell).split(NAMES_SEPARATOR)


def edge_label(sender: str, receiver: str) -> str:
    """An edge's label: "L0H1 -> L1H3.q"."""
    return f"{sender} {EDGE_ARROW} {receiver}"


def split_edge(label: str) -> tuple[str, str] | None:
    """(sender, receiver) of an edge's label, stripped; None for text with no single arrow."""
    parts = str(label).split(EDGE_ARROW)
    return (parts[0].strip(), parts[1].strip()) if len(parts) == 2 else None


def join_heads(heads: list[Head], separator: str = HEADS_SEPARATOR) -> str:
    """Heads as one table cell ("L0H1 L1H2"), or with MASK_SEPARATOR as a mask's name ("L0H1+L1H2")."""
    return separator.join(head_label(*head) for head in heads)


def split_heads(cell: str) -> list[str]:
    """The head labels join_heads wrote into one table cell."""
    return str(cell).split()


def split_mask(spec: str) -> list[str]:
    """The items of a mask's name or spec joined by "+" (L0H1+L1H2), as written (checked by the caller)."""
    return spec.split(MASK_SEPARATOR)


def receiver_head(label: str) -> str | None:
    """The head whose input a receiver label names (L1H3.q: L1H3); None for another receiver (L0.mlp, logits)."""
    parsed = split_input(label)
    return head_label(*parsed[0]) if parsed is not None else None


def kind_head_label(kind: str | None, layer: int, head: int) -> str:
    """A head's label with its kind (enc.L1H3, dec.L1H3, cross.L1H3), or the bare L1H3 for kind None."""
    return head_label(layer, head) if kind is None else f"{kind}.{head_label(layer, head)}"


def parse_kind_head(label: str) -> KindHead | None:
    """(kind, layer, head) of L1H3 (kind None) or <kind>.L1H3 (any lower-case kind: the caller checks it against
    the model's kinds, so a misspelt kind gets a message naming the kinds); None for any other text."""
    match = KIND_HEAD.fullmatch(str(label).strip())
    return (match[1], int(match[2]), int(match[3])) if match else None


class KindRows(list):
    """An encoder-decoder's heads as the one (L, H) grid the scans work on: its rows are the encoder's layers, then
    the decoder's, then the decoder's cross-attention layers, each row a (kind, layer); as a list, the heads of each
    row (what `heads_per_layer` is for a one-stack model), so masks, gates and (L, H) tensors keep their shapes.
    Labels name a row's heads by kind (cross.L1H3) and its whole row by kind and layer (cross.L1)."""

    def __init__(self, kinds: dict[str, tuple[int, int]], per_layer: dict[str, list[int]] | None = None):
        """kinds: each kind's (layers, heads); per_layer: each kind's heads in every layer, where they differ (a
        structurally pruned model's), in place of the kinds' heads."""
        per_layer = per_layer or {kind: [heads] * layers for kind, (layers, heads) in kinds.items()}
        super().__init__(heads for kind in kinds for heads in per_layer[kind])
        self.rows = [(kind, layer) for kind, (layers, _) in kinds.items() for layer in range(layers)]

    def row(self, kind: str, layer: int) -> int:
        """The grid row of a kind's layer; ValueError for one the model lacks."""
        return self.rows.index((kind, int(layer)))

    def head_label(self, row: int, head: int) -> str:
        return kind_head_label(*self.rows[row], head)

    def layer_label(self, row: int) -> str:
        kind, layer = self.rows[row]
        return f"{kind}.L{layer}"

    def kinds(self) -> list[str]:
        return list(dict.fromkeys(kind for kind, _ in self.rows))

    def kind_rows(self, kind: str) -> list[int]:
        return [row for row, (k, _) in enumerate(self.rows) if k == kind]


def grid_head_label(heads_per_layer: list[int], row: int, head: int) -> str:
    """A head's label in a model's grid: enc.L1H3 on an encoder-decoder's (KindRows), L1H3 on a one-stack model's."""
    return heads_per_layer.head_label(row, head) if isinstance(heads_per_layer, KindRows) else head_label(row, head)


def grid_layer_label(heads_per_layer: list[int], row: int) -> str:
    """A layer's label in a model's grid: cross.L1 on an encoder-decoder's, L1 on a one-stack model's."""
    return heads_per_layer.layer_label(row) if isinstance(heads_per_layer, KindRows) else f"L{row}"
