"""Head labels, built and parsed here alone: a head is `L1H3` (layer 1, head 3) in masks, tables, figures, findings
and the circuits graph; a head's input is `L1H3.q` (.k, .v); a set of names in one table cell (path_patching's
receivers) is joined by ", ". Every reader of a table parses its names with the functions that wrote them.

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


def kind_head_label(kind: str | None, layer: int, head: int) -> str:
    """A head's label with its kind (enc.L1H3, dec.L1H3, cross.L1H3), or the bare L1H3 for kind None."""
    return head_label(layer, head) if kind is None else f"{kind}.{head_label(layer, head)}"


def parse_kind_head(label: str) -> KindHead | None:
    """(kind, layer, head) of L1H3 (kind None) or <kind>.L1H3 (any lower-case kind: the caller checks it against
    the model's kinds, so a misspelt kind gets a message naming the kinds); None for any other text."""
    match = KIND_HEAD.fullmatch(str(label).strip())
    return (match[1], int(match[2]), int(match[3])) if match else None
