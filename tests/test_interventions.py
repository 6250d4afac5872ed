"""Named sites and interventions in the model's own forward: one parser of site names, every site's shape as the
table says, an empty or do-nothing intervention gives the plain model's bits, a head computed from its own q/k/v
inputs equals the head from the stream (float64, every family the tests build), gradients flow through edits, and a
bad hook is one line naming the site."""

import pytest
import torch

from headcount.errors import ConfigError
from headcount.model import AttentionConfig, ModelConfig, Transformer
from headcount.model.intervention import Intervention, add, gated, keep, reads, replace
from headcount.model.sites import HEAD_INPUTS, SHAPES, Site, parse_site, site_names


def tiny(mlp: bool = True, n_kv_heads: int | None = 2, dtype=torch.float32, **extra) -> Transformer:
    torch.manual_seed(0)
    attn = AttentionConfig(n_heads=4, n_kv_heads=n_kv_heads)
    cfg = ModelConfig(d_model=32, n_ctx=16, n_layers=2, vocab_size=50, attn=attn, mlp=mlp, **extra)
    return Transformer(cfg).to(dtype).eval()


def ids(B: int = 2, T: int = 10) -> torch.Tensor:
    return torch.randint(0, 50, (B, T), generator=torch.Generator().manual_seed(1))


def test_every_site_name_parses_back_to_itself():
    for name in site_names(3):
        site = parse_site(name)
        assert site.name == name and str(site) == name and site.shape == SHAPES[site.kind]
    assert parse_site("blocks.2.attn.z") == Site("attn.z", 2)
    assert len(site_names(2)) == 3 + 2 * 15 and len(site_names(2, mlp=False)) == 3 + 2 * 11


@pytest.mark.parametrize("name", ["blocks.x.attn.z", "blocks.1.attn.hook_z", "resid", "blocks.1", "blocks.-1.attn.z"])
def test_a_bad_site_name_is_one_line_naming_it(name):
    with pytest.raises(ConfigError) as error:
        parse_site(name)
    assert str(error.value).startswith(f"hooks.site={name!r}: allowed: embed") and "\n" not in str(error.value)


@pytest.mark.parametrize("mlp", [True, False])
def test_every_site_has_the_shape_the_table_gives(mlp):
    model = tiny(mlp)
    names = site_names(model.n_layers, mlp)
    intervention = Intervention(cache=names)
    with torch.no_grad():
        model(ids(), intervention=intervention)
    sizes = dict(B=2, T=10, C=32, H=4, G=2, D=8, F=4 * 32, V=50)
    assert list(intervention.cache) == names  # in the order the forward reaches them
    for name, value in intervention.cache.items():
        letters = SHAPES[parse_site(name).kind].strip("()").split(", ")
        assert tuple(value.shape) == tuple(sizes[x] for x in letters), name


def test_an_empty_or_do_nothing_intervention_gives_the_plain_bits():
    model = tiny()
    with torch.no_grad():
        plain = model(ids())
        assert torch.equal(model(ids(), intervention=Intervention()), plain)
        # every site that the plain path computes anyway: the same operations, so the same bits
        cheap = [n for n in site_names(2) if parse_site(n).kind not in (*HEAD_INPUTS, "attn.pattern")]
        watched = Intervention(hooks=[(n, lambda x, s: None) for n in cheap], cache=cheap)
        assert torch.equal(model(ids(), intervention=watched), plain)
        # the others take the per-head and the explicit attention path: equal to rounding
        everything = Intervention(hooks=[(n, lambda x, s: x.clone()) for n in site_names(2)])
        torch.testing.assert_close(model(ids(), intervention=everything), plain, rtol=0, atol=1e-5)


def test_cached_sites_equal_the_blocks_own_steps():
    model = tiny()
    read = reads(["resid_pre", "attn.z", "attn.pattern"], [1])
    with torch.no_grad():
        model(ids(), read)
        block, resid_BTC = model.blocks[1], model.blocks[0](model.embed(ids()))
        q_BHTD, k_BGTD, v_BGTD = block.attn.project(block.ln_attn(resid_BTC))
        k_BHTD, v_BHTD = block.attn.per_query_head(k_BGTD), block.attn.per_query_head(v_BGTD)
        z_BHTD, pattern_BHTT = block.attn.reference_attention(q_BHTD, k_BHTD, v_BHTD)
    assert torch.equal(read.read("resid_pre", 1), resid_BTC)
    assert torch.equal(read.read("attn.pattern", 1), pattern_BHTT)
    assert torch.equal(read.read("attn.z", 1), z_BHTD.transpose(1, 2))
    # the fast path's z (no pattern asked) equals the explicit path's to rounding
    torch.testing.assert_close(block.attn.heads(block.ln_attn(resid_BTC)), z_BHTD.transpose(1, 2), rtol=0, atol=1e-6)


def test_the_forward_has_one_way_in():
    import inspect

    from headcount.model.attention import MultiHeadAttention
    from headcount.model.block import Block

    def params(fn) -> list[str]:
        return list(inspect.signature(fn).parameters)

    assert params(Transformer.forward) == ["self", "idx_BT", "intervention", "token_types"]
    # beside the intervention only an encoder-decoder stack's inputs: padded source keys, the encoder's memory
    assert params(Transformer.forward_layers) == ["self", "resid_BTC", "start", "intervention", "keep_BT", "memory"]
    assert params(Block.forward) == ["self", "x_BTC", "intervention", "bias", "cross"]
    for old in ("gates", "replacements", "gate_where", "cache", "need_patterns"):
        assert old not in params(MultiHeadAttention.forward) + params(MultiHeadAttention.heads)


def test_gates_of_a_wrong_shape_are_one_line_naming_gates():
    with pytest.raises(ConfigError, match=r"^gates=\(2, 3\): allowed shapes: \(2, 4\) or \(2, 2, 4\)$"):
        tiny()(ids(), gated(torch.ones(2, 3)))


def test_replace_and_add_change_what_follows_and_the_z_site_sees_gates():
    model = tiny(dtype=torch.float64)
    gates = torch.ones(2, 4, dtype=torch.float64)
    gates[1, 2] = 0

    def zero_head(z, site):
        z = z.clone()
        z[:, :, 2] = 0
        return z

    with torch.no_grad():
        ablated = model(ids(), gated(gates))
        hooked = model(ids(), intervention=Intervention([("blocks.1.attn.z", zero_head)]))
        torch.testing.assert_close(hooked, ablated, rtol=0, atol=1e-12)
        before: dict = {}
        seen = gated(gates, hooks=[("blocks.1.attn.z", keep(before))], cache=["blocks.1.attn.z"])
        model(ids(), seen)
        assert seen.cache["blocks.1.attn.z"][:, :, 2].abs().max() == 0  # the cache: after the gate
        assert before["blocks.1.attn.z"][:, :, 2].abs().max() > 0  # a hook ahead of the gate sees z before it
        assert torch.equal(seen.cache["blocks.1.attn.z"][:, :, :2], before["blocks.1.attn.z"][:, :, :2])
        stream = Intervention(cache=["blocks.1.resid_post"])
        model(ids(), intervention=stream)
        final = Intervention([("blocks.1.resid_post", replace(stream.cache["blocks.1.resid_post"]))])
        torch.testing.assert_close(model(ids(), intervention=final), model(ids()), rtol=0, atol=1e-12)
        v = torch.randn(32, dtype=torch.float64)
        shifted_stream = Intervention([("blocks.1.resid_post", add(v))], cache=["blocks.1.resid_post"])
        shifted = model(ids(), intervention=shifted_stream)
        torch.testing.assert_close(shifted, model.unembed(stream.cache["blocks.1.resid_post"] + v), rtol=0, atol=1e-12)
        # a cached value is what flows on: after the site's hooks
        assert torch.equal(shifted_stream.cache["blocks.1.resid_post"], stream.cache["blocks.1.resid_post"] + v)


def test_gradients_flow_through_an_added_vector():
    model = tiny(dtype=torch.float64)
    v = torch.zeros(32, dtype=torch.float64, requires_grad=True)
    intervention = Intervention([("blocks.1.resid_pre", add(v))], cache=["blocks.1.resid_pre"])
    loss = model(ids(), intervention=intervention).logsumexp(-1).sum()
    at_site = intervention.cache["blocks.1.resid_pre"]
    (g_site,) = torch.autograd.grad(loss, at_site, retain_graph=True)
    loss.backward()
    torch.testing.assert_close(v.grad, g_site.sum((0, 1)), rtol=0, atol=1e-10)
    assert v.grad.abs().sum() > 0


def test_a_hook_that_raises_or_returns_the_wrong_shape_is_one_line_naming_the_site():
    model = tiny()

    def broken(x, site):
        raise RuntimeError("boom\nsecond line")

    with pytest.raises(ConfigError) as error:
        model(ids(), intervention=Intervention([("blocks.1.attn.z", broken)]))
    message = str(error.value)
    assert message.startswith("hooks.site='blocks.1.attn.z': its hook") and "RuntimeError: boom" in message
    assert "\n" not in message
    with pytest.raises(ConfigError, match=r"^hooks.site='blocks.0.mlp_out': .*returned \(2, 10\); .*\(2, 10, 32\)$"):
        model(ids(), intervention=Intervention([("blocks.0.mlp_out", lambda x, s: x.sum(-1))]))
    with pytest.raises(ConfigError, match=r"^hooks.site='blocks.2.attn.z': this model has layers 0..1$"):
        model(ids(), intervention=Intervention(cache=["blocks.2.attn.z"]))
    with pytest.raises(ConfigError, match=r"^hooks.site='blocks.0.mlp_in': this model has no MLPs"):
        tiny(mlp=False)(ids(), intervention=Intervention(cache=["blocks.0.mlp_in"]))
    with pytest.raises(ConfigError, match=r"^hooks.site='embed': a hook must be callable"):
        Intervention([("embed", 3)])


def heads_agree(model: Transformer, dtype: torch.dtype, tol: float) -> None:
    """Each layer: its heads from their own q/k/v inputs (each the layer's input stream) equal its heads from the
    stream, and the model run through the per-head input path equals the plain model."""
    model = model.to(dtype).eval()
    tokens = ids(2, 12) % model.cfg.vocab_size
    streams = reads(["resid_pre"], range(model.n_layers))
    with torch.no_grad():
        plain = model(tokens, streams)
        for layer, block in enumerate(model.blocks):
            x_BTC = streams.read("resid_pre", layer)
            H = block.attn.n_heads
            from_stream = block.attn.heads(block.ln_attn(x_BTC))
            from_inputs = block.heads_from_inputs(x_BTC[:, None, None].expand(-1, H, 3, -1, -1))
            torch.testing.assert_close(from_inputs, from_stream, rtol=0, atol=tol)
        names = [f"blocks.{layer}.{site}" for layer in range(model.n_layers) for site in HEAD_INPUTS]
        through_inputs = model(tokens, intervention=Intervention([(n, lambda x, s: x.clone()) for n in names]))
    torch.testing.assert_close(through_inputs, plain, rtol=0, atol=tol)


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"positions": "shortformer"},
        {"positions": "rotary", "norm": "rmsnorm", "qk_norm": "head"},
        {"norm": "rmsnorm", "qk_norm": "projection"},
    ],
)
def test_a_head_from_its_inputs_equals_the_head_from_the_stream_on_headcount_models(extra):
    heads_agree(tiny(**extra), torch.float64, 1e-12)


def test_a_head_from_its_inputs_equals_the_head_from_the_stream_on_every_family():
    pytest.importorskip("transformers")
    import family_cases
    import pretrained_helpers

    from headcount.pretrained import convert

    for cases in (pretrained_helpers, family_cases):
        for case in cases.CASES:
            heads_agree(convert(cases.hf_model(case)), torch.float64, 1e-12)


def test_heads_from_inputs_at_some_queries_equals_the_whole_run_there():
    """heads_from_inputs with queries (a suffix run's slots): z at those positions, as the whole run gives it."""
    model = tiny(dtype=torch.float64)
    block = model.blocks[1]
    stream_BTC = model.forward_layers(model.embed(ids()), 0)
    torch.manual_seed(2)  # each head's q, k and v inputs of its own
    resid_BTC = stream_BTC[:, None, None] + torch.randn(2, 2, 3, 10, 32, dtype=torch.float64)
    heads_K = torch.tensor([3, 1])
    whole_BTKD = block.heads_from_inputs(resid_BTC, heads_K)
    positions_BS = torch.tensor([[4, 5, 9], [0, 7, 8]])
    allowed_BST = torch.arange(10)[None, None] <= positions_BS[:, :, None]
    some_BSKD = block.heads_from_inputs(resid_BTC, heads_K, queries=(positions_BS, allowed_BST))
    expected_BSKD = whole_BTKD.gather(1, positions_BS[:, :, None, None].expand(-1, -1, 2, whole_BTKD.shape[-1]))
    torch.testing.assert_close(some_BSKD, expected_BSKD, rtol=0, atol=1e-12)


@pytest.mark.parametrize("site", ["attn.q", "attn.k_input", "attn.pattern"])
def test_a_site_inside_attention_is_refused_where_the_heads_come_from_elsewhere(site):
    model = tiny()
    block = model.blocks[0]
    x_BTC = model.embed(ids())
    with pytest.raises(ConfigError, match=rf"^hooks.site='blocks.0.{site}': a run over some .* no such site$"):
        block.forward_with_heads(x_BTC, Intervention([(f"blocks.0.{site}", lambda x, s: None)]), block.attn.heads)
