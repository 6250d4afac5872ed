"""The circuits core as a client of the model's forward (issue 33, "One forward"): the sites it puts receiver inputs in
and reads taps at (attn.qkv_input, attn.qkv_normed, mlp.input), the edge-patched forward through them equal to its
previous definition written out by hand over the blocks (float64, every family the circuits tests build, to the
bit), and circuits/ naming no attention internals."""

import re
from pathlib import Path

import pytest
import torch
from test_circuits import FAMILIES, make_model, prompts
from torch import Tensor

from headcount.circuits.forward import NodeOutputs, edge_forward, node_outputs
from headcount.circuits.graph import Graph
from headcount.errors import ConfigError
from headcount.model import AttentionConfig, ModelConfig, Transformer
from headcount.model.intervention import Intervention, add, keep
from headcount.model.sites import SHAPES, Site, parse_site, site_names

CIRCUITS = Path(__file__).resolve().parents[1] / "src" / "headcount" / "circuits"
# attention's and the block's internals: circuits/ reaches them only through Block and MultiHeadAttention methods
INTERNALS = re.compile(
    r"ln_attn\w*|combine_heads|\.W_O\b|parallel_residual|qk_norm|kv_groups?\b|kv_head_of|n_kv_heads|first_query_heads"
    r"|rotary|\.ln_mlp\w*|\.drop\b"
)


def tiny(dtype=torch.float64, n_kv_heads: int | None = 2, **extra) -> Transformer:
    torch.manual_seed(0)
    attn = AttentionConfig(n_heads=4, n_kv_heads=n_kv_heads)
    cfg = ModelConfig(d_model=32, n_ctx=16, n_layers=2, vocab_size=50, attn=attn, mlp=True, **extra)
    model = Transformer(cfg).to(dtype).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    return model


def ids(B: int = 2, T: int = 9) -> torch.Tensor:
    return torch.randint(0, 50, (B, T), generator=torch.Generator().manual_seed(1))


def test_circuits_names_no_attention_internals():
    """circuits/ keeps no attention math: no q/k norm, key/value group, rotary position, head combination, output
    matrix, input or post norm or residual form is named there (math notation such as W_O^h in prose aside)."""
    found = []
    for path in sorted(CIRCUITS.glob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if INTERNALS.search(line):
                found.append(f"{path.name}:{number}: {line.strip()}")
    assert not found, "\n".join(found)


def test_the_internals_pattern_sees_what_it_looks_for():
    for line in [
        "block.ln_attn(x)",
        "block.ln_attn_out is None",
        "attn.combine_heads(z)",
        "block.attn.W_O[h]",
        "cfg.parallel_residual",
        "features.qk_norm",
        "attn.kv_groups",
        "attn.rotary",
        "block.ln_mlp",
    ]:
        assert INTERNALS.search(line), line
    assert not INTERNALS.search("a head's delta enters as (z'_h - z_h) W_O^h")


@pytest.mark.parametrize("kind", ["attn.qkv_input", "attn.qkv_normed"])
def test_own_head_inputs_have_the_tables_shape_and_change_nothing_when_read(kind):
    """Read, the per-head inputs hold the stream (normed) per head and input; the heads run from them equal the plain
    model to rounding (the explicit softmax path), float64."""
    model = tiny()
    with torch.no_grad():
        plain = model(ids())
        read = Intervention(cache=[Site(kind, 1)])
        logits = model(ids(), read)
    value = read.read(kind, 1)
    assert tuple(value.shape) == (2, 4, 3, 9, 32) and SHAPES[kind] == "(B, H, 3, T, C)"
    assert parse_site(f"blocks.1.{kind}") == Site(kind, 1) and f"blocks.1.{kind}" not in site_names(2)
    resid = Intervention(cache=[Site("resid_pre", 1)])
    with torch.no_grad():
        model(ids(), resid)
        stream = resid.read("resid_pre", 1)
        expected = stream if kind == "attn.qkv_input" else model.blocks[1].ln_attn(stream)
    assert torch.equal(value, expected[:, None, None].expand_as(value))
    torch.testing.assert_close(logits, plain, atol=1e-12, rtol=0)


def test_own_inputs_give_heads_of_one_group_keys_of_their_own():
    """Under grouped-query attention k_input addresses the shared key/value head (both query heads of the group
    change), attn.qkv_input one query head's own k input (only that head changes)."""
    model = tiny()
    nudge = torch.randn(32, dtype=torch.float64, generator=torch.Generator().manual_seed(2))

    def z_after(site: str, edit) -> torch.Tensor:
        kept: dict[str, torch.Tensor] = {}
        with torch.no_grad():
            model(ids(), Intervention([(site, edit), ("blocks.1.attn.z", keep(kept))]))
        return kept["blocks.1.attn.z"]

    base = z_after("blocks.1.attn.qkv_input", lambda x, s: None)

    def own(x, s):
        x = x.clone()
        x[:, 0, 1] += nudge  # query head 0's k input; head 1 shares its key/value head
        return x

    def shared(x, s):
        x = x.clone()
        x[:, :, 0] += nudge  # key/value head 0's input: query heads 0 and 1
        return x

    changed_own = (z_after("blocks.1.attn.qkv_input", own) - base).abs().amax(dim=(0, 1, 3))
    changed_shared = (z_after("blocks.1.attn.k_input", shared) - base).abs().amax(dim=(0, 1, 3))
    assert changed_own[0] > 1e-3 and torch.all(changed_own[1:] < 1e-12)
    assert torch.all(changed_shared[:2] > 1e-3) and torch.all(changed_shared[2:] < 1e-12)


@pytest.mark.parametrize("parallel", [False, True])
def test_mlp_input_changes_the_mlps_input_and_not_the_stream(parallel):
    """A hook at mlp.input reaches the MLP alone: the layer's output is the unhooked stream after attention (its
    input in a parallel block) plus the MLP of the changed input."""
    model = tiny(parallel_residual=parallel, n_kv_heads=None)
    shift = torch.randn(32, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    names = ["resid_pre", "attn_out", "mlp.input", "mlp_out", "resid_post"]
    plain, edited = Intervention(cache=[Site(n, 0) for n in names]), None
    with torch.no_grad():
        model(ids(), plain)
        edited = Intervention([("blocks.0.mlp.input", add(shift))], cache=[Site(n, 0) for n in names])
        model(ids(), edited)
        block = model.blocks[0]
        after_attn = plain.read("resid_pre", 0) + plain.read("attn_out", 0)
        read = plain.read("resid_pre", 0) if parallel else after_attn
        assert torch.equal(plain.read("mlp.input", 0), read)
        assert torch.equal(edited.read("mlp_out", 0), block.mlp_out(read + shift))
        assert torch.equal(edited.read("resid_post", 0), after_attn + edited.read("mlp_out", 0))
        assert not torch.allclose(edited.read("mlp_out", 0), plain.read("mlp_out", 0))


def test_a_layer_takes_per_head_inputs_one_way():
    model = tiny()
    both = Intervention([("blocks.0.attn.q_input", lambda x, s: None), ("blocks.0.attn.qkv_input", lambda x, s: None)])
    with pytest.raises(ConfigError) as error:
        model(ids(), both)
    assert str(error.value).startswith("hooks.site='blocks.0.attn.qkv_input': a layer takes per-head inputs")
    assert "\n" not in str(error.value)


def previous_edge_stream(model: Transformer, emb_BTC: Tensor, weights: Tensor, corrupted: NodeOutputs) -> Tensor:
    """The edge-patched forward's logits input as circuits/forward.py computed it before it ran through the model's
    forward, written out over the blocks: every receiver input summed from its senders' outputs mixed by its edges,
    a head's z from its own three inputs (Block.heads_from_inputs), an MLP's output from its input."""
    graph = Graph.of(model)
    n = weights.shape[0]
    emb = emb_BTC.repeat(n, 1, 1)
    rows = emb.shape[0]
    target = corrupted.repeat(n)
    w_all = weights.repeat_interleave(rows // n, dim=0)
    senders: list[tuple[str, int, Tensor, Tensor]] = [("emb", 0, emb, target.emb - emb)]

    def attention(block, z, dz, w_RXH):
        mixed = z[:, None] + w_RXH[:, :, None, :, None] * dz[:, None]
        out = block.attn.combine_heads(mixed.flatten(0, 1))
        out = out if block.ln_attn_out is None else block.ln_attn_out(out)
        return out.view(rows, -1, *out.shape[1:])

    def receiver_input(receiver) -> Tensor:
        """(rows, T, C)"""
        w = w_all[:, graph.edge_slices[receiver]]
        x, pos = None, 0
        for kind, layer, out, delta in senders:
            if pos >= graph.n_senders(receiver):
                break
            if kind == "emb" or kind == "mlp":
                term = out + w[:, pos, None, None] * delta
                pos += 1
            else:
                block, H = model.blocks[layer], graph.heads_per_layer[layer]
                term = attention(block, out, delta, w[:, None, pos : pos + H])[:, 0]
                pos += H
            x = term if x is None else x + term
        return x

    for layer, block in enumerate(model.blocks):
        receivers = graph.layer_receivers(layer)
        H = graph.heads_per_layer[layer]
        x_RHWTC = torch.stack([receiver_input(r) for r in receivers[: 3 * H]], 1).view(rows, H, 3, *emb.shape[1:])
        z = block.heads_from_inputs(x_RHWTC)
        senders.append(("heads", layer, z, target.z[layer] - z))
        if graph.mlp:
            out = block.mlp_out(receiver_input(receivers[-1]))
            senders.append(("mlp", layer, out, target.mlp[layer] - out))
    return receiver_input(graph.receivers[-1])


@pytest.mark.parametrize("family", FAMILIES)
def test_the_edge_forward_through_the_model_equals_its_definition(family):
    """float64, every family: weights 0 give the plain model, weights 1 the corrupted run, random weights the previous
    definition written out over the blocks (previous_edge_stream) to rounding."""
    model = make_model(family)
    clean, corrupted = prompts(T=9)
    n_edges = len(Graph.of(model).edges)
    g = torch.Generator().manual_seed(3)
    weights = torch.cat([torch.zeros(1, n_edges), torch.ones(1, n_edges), torch.rand(2, n_edges, generator=g)])
    weights = weights.double()
    with torch.no_grad():
        corrupted_outs = node_outputs(model, corrupted)
        logits, _ = edge_forward(model, model.embed(clean), weights, corrupted_outs)
        logits = logits.view(4, *clean.shape, -1)
        torch.testing.assert_close(logits[0], model(clean), atol=1e-10, rtol=1e-10)
        torch.testing.assert_close(logits[1], model(corrupted), atol=1e-10, rtol=1e-10)
        reference = model.unembed(previous_edge_stream(model, model.embed(clean), weights[2:], corrupted_outs))
        torch.testing.assert_close(logits[2:].flatten(0, 1), reference, atol=1e-10, rtol=1e-10)
        assert not torch.allclose(logits[2], logits[3], atol=1e-6)  # the rows' weights matter
