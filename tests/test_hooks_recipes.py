"""docs/guide/interventions.md's recipes, each equal to transformers run with raw PyTorch hooks on the same tiny
random Llama (grouped-query attention: 4 query heads, 2 key/value heads), and EAP through hooks equal to headcount's
circuits EAP: zero a head and get the loss, patch a head from a corrupted prompt, path-patch a sender into a receiver's
query, add a steering vector to the stream, zero one MLP neuron, replace one head's attention pattern, EAP scores."""

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("transformers")

from pretrained_helpers import converted, tokens  # noqa: E402

from headcount import HookedModel  # noqa: E402
from headcount.circuits import Graph, eap_scores  # noqa: E402
from headcount.model.intervention import add  # noqa: E402

CASE, ATOL = "llama_gqa_untied", 1e-5
LAYER, HEAD = 1, 2  # head 2 reads key/value head 1


@pytest.fixture(scope="module")
def both():
    hf, model = converted(CASE)
    return hf, HookedModel(model)


def hf_logits(hf, ids, pre_hooks=(), hooks=()) -> torch.Tensor:
    """transformers' logits with raw hooks: (module, fn) forward pre-hooks (with kwargs) and forward hooks."""
    handles = [m.register_forward_pre_hook(fn, with_kwargs=True) for m, fn in pre_hooks]
    handles += [m.register_forward_hook(fn) for m, fn in hooks]
    try:
        with torch.no_grad():
            return hf(ids).logits
    finally:
        for h in handles:
            h.remove()


def hf_input(args, kwargs):
    return args[0] if args else kwargs["hidden_states"]


def with_input(args, kwargs, x):
    return ((x, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": x})


def loss(logits, ids):
    return F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())


def test_zero_a_head_and_get_the_loss(both):
    hf, model = both
    ids, D = tokens(), model.model.head_dim

    def zero_head(z, site):
        z[:, :, HEAD] = 0

    with torch.no_grad():
        ours = model.loss(ids, hooks=[(f"blocks.{LAYER}.attn.z", zero_head)])
        plain = model.loss(ids)

    def theirs_hook(module, args, kwargs):
        z = args[0].clone()
        z[..., HEAD * D : (HEAD + 1) * D] = 0
        return (z,), kwargs

    theirs = loss(hf_logits(hf, ids, [(hf.model.layers[LAYER].self_attn.o_proj, theirs_hook)]), ids)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=ATOL)
    assert abs(float(ours) - float(plain)) > 1e-4  # the head matters


def test_patch_a_head_from_a_corrupted_prompt(both):
    hf, model = both
    clean, corrupted, D = tokens(seed=1), tokens(seed=2), model.model.head_dim
    with torch.no_grad():
        _, cache = model.run_with_cache(corrupted, names=[f"blocks.{LAYER}.attn.z"])

        def patch(z, site):
            z[:, :, HEAD] = cache[site.name][:, :, HEAD]

        ours = model.run_with_hooks(clean, hooks=[(f"blocks.{LAYER}.attn.z", patch)])

    o_proj, seen = hf.model.layers[LAYER].self_attn.o_proj, {}
    hf_logits(hf, corrupted, [(o_proj, lambda m, args, kwargs: seen.update(z=args[0]))])

    def patch_theirs(module, args, kwargs):
        z = args[0].clone()
        z[..., HEAD * D : (HEAD + 1) * D] = seen["z"][..., HEAD * D : (HEAD + 1) * D]
        return (z,), kwargs

    torch.testing.assert_close(ours, hf_logits(hf, clean, [(o_proj, patch_theirs)]), rtol=0, atol=ATOL)


def test_path_patch_a_sender_into_a_receivers_query(both):
    hf, model = both
    clean, corrupted, D = tokens(seed=1), tokens(seed=2), model.model.head_dim
    sender = 1  # L0H1 -> L1H2.q: only the receiver's query input sees the sender's corrupted output
    with torch.no_grad():
        _, clean_cache = model.run_with_cache(clean, names=["blocks.0.attn.z"])
        _, corrupted_cache = model.run_with_cache(corrupted, names=["blocks.0.attn.z"])
        dz = corrupted_cache["blocks.0.attn.z"][:, :, sender] - clean_cache["blocks.0.attn.z"][:, :, sender]
        change = dz @ model.model.blocks[0].attn.W_O[sender]  # (B, T, C): the sender's change as it joins the stream

        def receive(q_input, site):
            q_input[:, :, HEAD] += change

        ours = model.run_with_hooks(clean, hooks=[(f"blocks.{LAYER}.attn.q_input", receive)])

    layers, seen = hf.model.layers, {}
    o_proj0 = layers[0].self_attn.o_proj
    hf_logits(hf, corrupted, [(o_proj0, lambda m, args, kwargs: seen.update(corrupted=args[0]))])
    hf_logits(hf, clean, [(o_proj0, lambda m, args, kwargs: seen.update(clean=args[0]))])
    rows = slice(sender * D, (sender + 1) * D)
    hf_change = (seen["corrupted"][..., rows] - seen["clean"][..., rows]) @ o_proj0.weight[:, rows].T

    def stream_in(module, args, kwargs):
        seen["resid"] = hf_input(args, kwargs)

    def query(module, args, out):
        out = out.clone()
        q_rows = slice(HEAD * D, (HEAD + 1) * D)
        patched = layers[LAYER].input_layernorm(seen["resid"] + hf_change)
        out[..., q_rows] = patched @ module.weight[q_rows].T
        return out

    theirs = hf_logits(hf, clean, [(layers[LAYER], stream_in)], [(layers[LAYER].self_attn.q_proj, query)])
    torch.testing.assert_close(ours, theirs, rtol=0, atol=ATOL)
    assert (ours - model(clean)).abs().max() > 1e-4


def test_add_a_steering_vector_at_one_layer(both):
    hf, model = both
    ids, v = tokens(), torch.randn(model.model.cfg.d_model, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ours = model.run_with_hooks(ids, hooks=[(f"blocks.{LAYER}.resid_pre", add(v))])
        with model.hooks([(f"blocks.{LAYER}.resid_pre", add(v))]):  # the same as a context manager
            assert torch.equal(model(ids), ours)
        assert not torch.equal(model(ids), ours)  # leaving the block removed it

    def steer(module, args, kwargs):
        return with_input(args, kwargs, hf_input(args, kwargs) + v)

    torch.testing.assert_close(ours, hf_logits(hf, ids, [(hf.model.layers[LAYER], steer)]), rtol=0, atol=ATOL)


def test_zero_one_mlp_neuron(both):
    hf, model = both
    ids, neuron = tokens(), 7

    def zero_neuron(hidden, site):
        hidden[..., neuron] = 0

    with torch.no_grad():
        ours = model.run_with_hooks(ids, hooks=[("blocks.0.mlp.hidden", zero_neuron)])

    def theirs_hook(module, args, kwargs):
        hidden = args[0].clone()
        hidden[..., neuron] = 0
        return (hidden,), kwargs

    theirs = hf_logits(hf, ids, [(hf.model.layers[0].mlp.down_proj, theirs_hook)])
    torch.testing.assert_close(ours, theirs, rtol=0, atol=ATOL)
    assert (ours - model(ids)).abs().max() > 1e-4


def test_replace_one_heads_attention_pattern(both):
    hf, model = both
    ids, D = tokens(), model.model.head_dim
    T = ids.shape[1]
    uniform = torch.tril(torch.ones(T, T)) / torch.arange(1, T + 1)[:, None]  # every earlier position alike

    def flatten(pattern, site):
        pattern[:, HEAD] = uniform

    with torch.no_grad():
        ours = model.run_with_hooks(ids, hooks=[(f"blocks.{LAYER}.attn.pattern", flatten)])

    attn, seen = hf.model.layers[LAYER].self_attn, {}
    kv = HEAD // (attn.config.num_attention_heads // attn.config.num_key_value_heads)

    def values(module, args, out):
        seen["v"] = out[..., kv * D : (kv + 1) * D]

    def head_output(module, args, kwargs):
        z = args[0].clone()
        z[..., HEAD * D : (HEAD + 1) * D] = uniform @ seen["v"]
        return (z,), kwargs

    theirs = hf_logits(hf, ids, [(attn.o_proj, head_output)], [(attn.v_proj, values)])
    torch.testing.assert_close(ours, theirs, rtol=0, atol=ATOL)
    assert (ours - model(ids)).abs().max() > 1e-4


def test_eap_scores_through_hooks_equal_the_circuits_eap():
    _, model32 = converted(CASE)
    model = HookedModel(model32.double())
    clean, corrupted, answer, wrong = tokens(seed=1), tokens(seed=2), 3, 5
    heads = model.model.blocks[0].attn.n_heads
    groups = model.model.blocks[LAYER].attn.kv_head_of
    names = ["blocks.0.attn.z"]
    with torch.no_grad():
        _, corrupted_cache = model.run_with_cache(corrupted, names=names)
    inputs = [f"blocks.{LAYER}.attn.{x}_input" for x in "qkv"]
    logits, cache = model.run_with_cache(clean, names=names + inputs)
    metric = (logits[:, -1, answer] - logits[:, -1, wrong]).sum()
    grads = torch.autograd.grad(metric, [cache[name] for name in inputs])  # (B, T, heads, C) per input
    dz = corrupted_cache["blocks.0.attn.z"] - cache["blocks.0.attn.z"].detach()
    change_BTSC = torch.einsum("btsd,sdc->btsc", dz, model.model.blocks[0].attn.W_O.detach())
    ours = {x: torch.einsum("btsc,btrc->sr", change_BTSC, g) for x, g in zip("qkv", grads)}  # (senders, receivers)

    def metric_fn(logits_PV):
        return logits_PV[:, answer] - logits_PV[:, wrong]

    theirs = eap_scores(model.model, clean, corrupted, metric_fn)
    index = Graph.of(model.model).edge_index
    for s in range(heads):
        for h in range(heads):
            edge = theirs[index[f"L0H{s} -> L{LAYER}H{h}.q"]]
            torch.testing.assert_close(ours["q"][s, h], edge, rtol=0, atol=1e-10)
        for g in range(len(groups.unique())):  # a key/value input serves its group: the group's scores add up
            for x in "kv":
                group = [theirs[index[f"L0H{s} -> L{LAYER}H{h}.{x}"]] for h in range(heads) if groups[h] == g]
                torch.testing.assert_close(ours[x][s, g], torch.stack(group).sum(), rtol=0, atol=1e-10)
