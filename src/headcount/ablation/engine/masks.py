"""Head masks: which heads a scan switches off, by name, and as the (M, L, H) gates the model takes.

A mask lists (layer, head) pairs to switch off; every other head keeps gate 1. Names are readable and unique within a
scan: `L1H3` (one head), `L0` (a whole layer), `L1H3+L0H2` (a pair), `L2 keep H1` (layer 2 with only head 1 on),
`L1KV0` (every query head that reads layer 1's key/value head 0). An encoder-decoder's masks name their heads by
kind (`cross.L1H3`, `enc.L0`, `dec.L1 keep H2`, `cross.L1KV0`, `enc.L0H1+cross.L1H0`): its heads are one grid
(labels.KindRows), and a mask's (layer, head) pairs are that grid's rows and heads.
Custom masks come from a YAML or JSON file:

    - [[0, 1], [1, 3]]                     # heads L0H1 and L1H3 off; named L0H1+L1H3
    - {name: prev-token, heads: [[0, 2]]}  # a name of your own
    - [enc.L0H1, cross.L1H0]               # an encoder-decoder's heads, by name
"""

import itertools
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml
from torch import Tensor

from headcount.ablation.engine.heads import Head, all_heads, existing_heads, head_name, max_heads, top_heads
from headcount.errors import ConfigError
from headcount.labels import (
    KIND_NAMES,
    MASK_SEPARATOR,
    KindRows,
    grid_head_label,
    grid_layer_label,
    parse_head,
    parse_kind_head,
    split_mask,
)


@dataclass(frozen=True)
class HeadMask:
    name: str
    heads_off: tuple[Head, ...]
    layer: int = -1  # the layer the mask is about, where one is (single head, layer, leave-one-in)
    head: int = -1  # the head it is about, where one is (single head, leave-one-in)
    position: str = ""  # a task's named position the heads are replaced at alone ("": every position)
    kind: str = ""  # on an encoder-decoder, the kind of the layer it is about (enc, dec, cross); layer is the kind's


def about(
    heads_per_layer: list[int], name: str, heads_off: tuple[Head, ...], row: int = -1, head: int = -1, position=""
) -> HeadMask:
    """A mask about grid row `row` (and `head`): on an encoder-decoder's grid its layer is the kind's own layer and
    `kind` says which; on a one-stack model the row is the layer."""
    if isinstance(heads_per_layer, KindRows) and row >= 0:
        kind, layer = heads_per_layer.rows[row]
        return HeadMask(name, heads_off, layer, head, position, kind)
    return HeadMask(name, heads_off, row, head, position)


def joined_name(heads: tuple[Head, ...], heads_per_layer: list[int] | None = None) -> str:
    """A mask's name from its heads: L0H1+L1H2 (enc.L0H1+cross.L1H2 on an encoder-decoder's grid)."""
    return MASK_SEPARATOR.join(grid_head_label(heads_per_layer, *h) for h in heads) or "none"


def baseline_masks() -> list[HeadMask]:
    return [HeadMask("baseline", ())]


def single_head_masks(heads_per_layer: list[int], positions: list[str] | None = None) -> list[HeadMask]:
    """Each head off alone; with positions, each head at each named position alone (named L1H3@S2)."""
    hpl = heads_per_layer
    if positions:
        return [about(hpl, f"{head_name(*h)}@{p}", (h,), *h, p) for p in positions for h in all_heads(hpl)]
    return [about(hpl, grid_head_label(hpl, *h), (h,), *h) for h in all_heads(hpl)]


def layer_masks(heads_per_layer: list[int]) -> list[HeadMask]:
    """Every head of one layer off together (on an encoder-decoder, of one kind's layer: enc.L0, cross.L1)."""
    hpl = heads_per_layer
    return [about(hpl, grid_layer_label(hpl, row), tuple((row, h) for h in range(n)), row) for row, n in enumerate(hpl)]


def leave_one_in_masks(heads_per_layer: list[int]) -> list[HeadMask]:
    """Michel et al.'s "all but one": in one layer only head `keep` stays on; the other layers are untouched."""
    hpl = heads_per_layer
    return [
        about(
            hpl, f"{grid_layer_label(hpl, row)} keep H{keep}", tuple((row, h) for h in range(n) if h != keep), row, keep
        )
        for row, n in enumerate(hpl)
        for keep in range(n)
    ]


def kv_group_masks(kv_groups_per_layer: list[list[int]], heads_per_layer: list[int] | None = None) -> list[HeadMask]:
    """One mask per key/value head: all the query heads of its group off (consecutive query heads share a key/value
    head; `kv_groups_per_layer[l]` counts them per group, in order). Without grouped-query attention every group is one
    head and the masks are the single-head masks under other names. On an encoder-decoder's grid (heads_per_layer a
    KindRows) the rows are its kinds' layers, each with its own kind's groups, and a mask is named and about its kind's
    layer (`cross.L1KV0`: every cross-attention head of decoder layer 1 that reads its key/value head 0)."""
    masks = []
    for row, groups in enumerate(kv_groups_per_layer):
        layer = f"L{row}" if heads_per_layer is None else grid_layer_label(heads_per_layer, row)
        first = 0
        for kv_head, size in enumerate(groups):
            heads = tuple((row, h) for h in range(first, first + size))
            masks.append(about(heads_per_layer or [], f"{layer}KV{kv_head}", heads, row))
            first += size
    return masks


def pair_masks(heads: list[Head], heads_per_layer: list[int] | None = None) -> list[HeadMask]:
    """Every unordered pair of the given heads, off together."""
    pairs = itertools.combinations(sorted(heads), 2)
    return [HeadMask(joined_name(pair, heads_per_layer), pair) for pair in pairs]


def most_important_heads(delta_LH: Tensor, heads_per_layer: list[int], k: int) -> list[Head]:
    """The k heads whose single-head ablation raised the loss most; ties go to the lower (layer, head)."""
    return top_heads(delta_LH, heads_per_layer, k)


def load_custom_masks(path: str | Path, heads_per_layer: list[int], key: str) -> list[HeadMask]:
    """Masks from a YAML/JSON file (JSON is YAML), validated against the model's heads; ConfigError names `key`."""
    path = Path(path)
    try:
        entries = yaml.safe_load(path.read_text())
    except OSError as e:
        raise ConfigError(key, str(path), f"cannot be read ({e.strerror})") from None
    except yaml.YAMLError as e:
        reason = str(e).replace("\n", " ")
        raise ConfigError(key, str(path), f"does not parse as YAML or JSON: {reason}") from None
    if not isinstance(entries, list) or not entries:
        raise ConfigError(key, str(path), "must hold a non-empty list of masks")
    masks = [custom_mask(entry, f"{path} entry {i}", heads_per_layer, key) for i, entry in enumerate(entries)]
    names = [m.name for m in masks]
    duplicate = next((n for n in names if names.count(n) > 1), None)
    if duplicate is not None:
        raise ConfigError(key, f"{path}: name {duplicate!r}", "every mask needs a distinct name")
    return masks


def custom_mask(entry, where: str, heads_per_layer: list[int], key: str) -> HeadMask:
    """One entry of a masks file; `where` (file and entry number) goes into the error with the entry."""
    allowed = "each mask is a list of [layer, head] pairs, or {name: ..., heads: [[layer, head], ...]}"
    if isinstance(heads_per_layer, KindRows):
        allowed = "each mask is a list of head names (enc.L1H3, dec.L1H3, cross.L1H3), or {name: ..., heads: [...]}"
    name = None
    if isinstance(entry, dict):
        if set(entry) - {"name", "heads"} or "heads" not in entry:
            raise ConfigError(key, f"{where}: {json.dumps(entry)}", allowed)
        name, entry = entry.get("name"), entry["heads"]
        if not isinstance(name, (str, int, type(None))):
            raise ConfigError(key, f"{where}: name {json.dumps(name)}", "a mask name must be a string")
    if isinstance(heads_per_layer, KindRows):  # heads by name: [layer, head] would not say which kind
        if not isinstance(entry, list) or not all(isinstance(item, str) for item in entry):
            raise ConfigError(key, f"{where}: {json.dumps(entry)}", allowed)
        heads = tuple(sorted({grid_head(item, heads_per_layer, key, where) for item in entry}))
    else:
        if not isinstance(entry, list) or not all(is_pair(pair) for pair in entry):
            raise ConfigError(key, f"{where}: {json.dumps(entry)}", allowed)
        heads = tuple(sorted({(pair[0], pair[1]) for pair in entry}))
        for layer, head in heads:
            check_head_exists(layer, head, heads_per_layer, key, where)
    one = heads[0] if len(heads) == 1 else (-1, -1)
    return about(heads_per_layer, str(name) if name is not None else joined_name(heads, heads_per_layer), heads, *one)


def is_pair(pair) -> bool:
    return isinstance(pair, list) and len(pair) == 2 and all(type(x) is int for x in pair)


MaskSpec = HeadMask | str | Iterable[Head | str]  # one mask as the Python API takes it


def requested_masks(
    masks: Mapping[str, MaskSpec] | Iterable[MaskSpec],
    heads_per_layer: list[int],
    key: str = "masks",
    positions: list[str] = (),
) -> list[HeadMask]:
    """Masks as the Python API takes them, checked against the model's heads: a mapping name -> heads, or a list of
    masks, each a HeadMask, a name such as "L1H3+L0H2" (with a task's named positions: "L1H3@S2", the heads at that
    position alone), or (layer, head) pairs and "L1H3" names; unnamed ones are named after their heads."""
    named = masks.items() if isinstance(masks, Mapping) else ((None, spec) for spec in masks)
    result = [requested_mask(name, spec, heads_per_layer, key, list(positions)) for name, spec in named]
    names = [m.name for m in result]
    duplicate = next((n for n in names if names.count(n) > 1), None)
    if duplicate is not None:
        raise ConfigError(key, duplicate, "every mask needs a distinct name")
    return result


def requested_mask(
    name: str | None, spec: MaskSpec, heads_per_layer: list[int], key: str, positions: list[str]
) -> HeadMask:
    position = ""
    if isinstance(spec, HeadMask):
        name, position, spec = name or spec.name, spec.position, spec.heads_off
    elif isinstance(spec, str) and "@" in spec:
        spec, position = spec.rsplit("@", 1)
        name = name or f"{spec}@{position}"
    if position and position not in positions:
        named = ", ".join(positions) or "none (a task names them)"
        raise ConfigError(key, f"{spec}@{position}", f"no such named position; the task's: {named}")
    items = split_mask(spec) if isinstance(spec, str) else list(spec)
    if isinstance(spec, str) and "" in (item.strip() for item in items):  # "L0H3+" was reported as masks=''
        raise ConfigError(key, spec, 'an empty head name beside a "+": join head names as "L0H3+L1H2"')
    if isinstance(heads_per_layer, KindRows):
        heads = tuple(sorted({grid_head(item, heads_per_layer, key) for item in items if item != "none"}))
    else:
        heads = tuple(sorted({parsed_head(item, key) for item in items if item != "none"}))
        for layer, head in heads:
            check_head_exists(layer, head, heads_per_layer, key, str(name or spec))
    one = heads[0] if len(heads) == 1 else (-1, -1)
    named = str(name) if name is not None else joined_name(heads, heads_per_layer)
    return about(heads_per_layer, named, heads, *one, position)


def parsed_head(item: Head | str, key: str) -> Head:
    """(layer, head) from a pair or a name such as "L1H3"."""
    parsed = parse_head(item) if isinstance(item, str) else None
    if parsed is not None:
        return parsed
    if not isinstance(item, str) and len(item) == 2 and all(isinstance(x, int) for x in item):
        return int(item[0]), int(item[1])
    kind_head = parse_kind_head(item) if isinstance(item, str) else None
    if kind_head is not None:  # enc.L1H3, cross.L1H3: an encoder-decoder's names, and scans run on one stack
        what = KIND_NAMES.get(kind_head[0], f"kind {kind_head[0]!r}")
        raise ConfigError(key, item, f'names {what} heads, which this one-stack model lacks: name heads like "L1H3"')
    raise ConfigError(key, item, 'a head is a (layer, head) pair or a name such as "L1H3"')


def grid_head(item: str, grid: KindRows, key: str, where: str = "") -> Head:
    """(row, head) in an encoder-decoder's grid of a head named by kind (cross.L1H3); one ConfigError naming the
    kinds, layers or heads the model has otherwise."""
    example = "enc.L1H3, dec.L1H3 or cross.L1H3"
    parsed = parse_kind_head(item) if isinstance(item, str) else None
    if parsed is None:
        raise ConfigError(key, item if isinstance(item, str) else list(item), f"a head is named like {example}")
    value = f"{where}: {item}" if where else item  # a masks file's entry says which
    kind, layer, head = parsed
    if kind is None:
        raise ConfigError(key, value, f"an encoder-decoder's heads are named by kind: {example}")
    if kind not in grid.kinds():
        raise ConfigError(key, value, f"no such head kind; this encoder-decoder's: {', '.join(grid.kinds())}")
    layers = len(grid.kind_rows(kind))
    if layer >= layers:
        raise ConfigError(
            key, item, f"no such layer: the {KIND_NAMES[kind]} layers are {kind}.L0..{kind}.L{layers - 1}"
        )
    row = grid.row(kind, layer)
    if head >= grid[row]:
        raise ConfigError(key, value, f"no such head: {kind}.L{layer} has heads 0..{grid[row] - 1}")
    return row, head


def check_head_exists(layer: int, head: int, heads_per_layer: list[int], key: str, where: str = "") -> None:
    value = f"{where}: [{layer}, {head}]" if where else [layer, head]
    if not 0 <= layer < len(heads_per_layer):
        raise ConfigError(key, value, f"no such layer: the model has layers 0..{len(heads_per_layer) - 1}")
    if not 0 <= head < heads_per_layer[layer]:
        raise ConfigError(key, value, f"no such head: layer {layer} has heads 0..{heads_per_layer[layer] - 1}")


def masks_to_gates(masks: list[HeadMask], heads_per_layer: list[int], dtype: torch.dtype = torch.float32) -> Tensor:
    """(M, L, H) gates: 0 for each head a mask switches off, 1 elsewhere (H is the largest head count)."""
    gates_MLH = torch.ones(len(masks), len(heads_per_layer), max_heads(heads_per_layer), dtype=dtype)
    for i, mask in enumerate(masks):
        for layer, head in mask.heads_off:
            gates_MLH[i, layer, head] = 0
    return gates_MLH


def gates_to_masks(gates_MLH: Tensor, heads_per_layer: list[int]) -> list[HeadMask]:
    """The named masks behind 0/1 gates (what pruning hands over), so their results can be saved by name."""
    exists_LH = existing_heads(heads_per_layer, gates_MLH.shape[2])
    masks = []
    for gates_LH in gates_MLH.cpu():
        heads = tuple((int(layer), int(head)) for layer, head in ((gates_LH == 0) & exists_LH).nonzero())
        masks.append(HeadMask(joined_name(heads, heads_per_layer), heads))
    return masks
