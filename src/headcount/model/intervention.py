"""An intervention on the model's forward: at named sites (sites.py), read (cache) an activation, replace it, add to
it, or pass it through a function; several sites and several edits per site at once, applied in the order given.

    Intervention(hooks=[("blocks.1.attn.z", fn)], cache=["blocks.0.resid_post"])

A hook is fn(tensor, site) -> None (the tensor flows on unchanged) or a tensor of the same shape (it flows on instead);
`replace` and `add` are hooks built from a value. What a site's cache keeps is the activation after that site's hooks,
as the rest of the forward sees it; under torch.enable_grad it stays in the autograd graph, so gradients flow through
replaced and added values and into cached ones. The model's forward asks `touches(layer)` once per layer and runs its
plain code where nothing is asked, so an empty intervention costs nothing measurable (scripts/bench_hooks.py).
A hook that raises or returns anything but None or a tensor of the site's shape is a one-line ConfigError naming the
site.

The forward has no other way in: head gates and mode replacements are `Gates`, a hook at every layer's attn.z site
(z_h <- g z_h + (1 - g) r_h, the ablation evaluator's many masks per batch as gates (B, L, H)); what the forward keeps
for a caller (the stream into each layer, each head's z, the attention patterns) is a read of its sites, `reads`.
"""

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import Tensor

from headcount.errors import ConfigError
from headcount.model.attention import MultiHeadAttention
from headcount.model.sites import KEY, STACK_SITES, Site, parse_site

Hook = Callable[[Tensor, Site], Tensor | None]


class Intervention:
    """stack: an encoder-decoder's stack ("enc", "dec") whose forward runs this intervention (sites given without
    it, as the stack looks them up): its hooks then see, its errors and its cache name, the site with its stack."""

    def __init__(
        self, hooks: Iterable[tuple[str | Site, Hook]] = (), cache: Iterable[str | Site] = (), stack: str | None = None
    ):
        self.stack = stack
        self.hooks: dict[Site, list[Hook]] = {}
        for name, fn in hooks:
            if not callable(fn):
                raise ConfigError(
                    KEY, str(name), f"a hook must be callable (tensor, site) -> tensor or None, not {fn!r}"
                )
            self.hooks.setdefault(as_site(name), []).append(fn)
        # each Gates hook once (it sits at every layer's attn.z), found here, outside a compiled forward
        self.gates = list({id(fn): fn for fns in self.hooks.values() for fn in fns if isinstance(fn, Gates)}.values())
        self.cached_sites: set[Site] = {as_site(name) for name in cache}
        self.cache: dict[str, Tensor] = {}
        self.sites = set(self.hooks) | self.cached_sites
        self.layers = {site.layer for site in self.sites}

    def read(self, kind: str, layer: int | None = None) -> Tensor:
        """The cached activation of the site `kind` of `layer` (None: a model site), e.g. read("attn.z", 1)."""
        return self.cache[self.named(Site(kind, layer)).name]

    def named(self, site: Site) -> Site:
        """The site as hooks see it and errors and the cache name it: with this intervention's stack."""
        return site if self.stack is None else Site(site.kind, site.layer, self.stack)

    def __bool__(self) -> bool:
        return bool(self.sites)

    def touches(self, layer: int | None) -> bool:
        """Whether any site of this layer (None: the model's own sites) is asked for."""
        return layer in self.layers

    def wants(self, site: Site) -> bool:
        return site in self.sites

    def check(self, model, batch: int) -> None:
        """ConfigError for a site the model does not have (a layer past its last, an MLP site of an attention-only
        model) and for gates of the wrong shape or outside [0, 1] (`Gates.check`). model: the Transformer."""
        for gates in self.gates:
            gates.check(model, batch)
        n_layers = model.n_layers
        for site in self.sites:
            name = self.named(site).name
            if site.layer is not None and site.layer >= n_layers:
                stack = "this model" if self.stack is None else f"this {dict(enc='encoder', dec='decoder')[self.stack]}"
                raise ConfigError(KEY, name, f"{stack} has layers 0..{n_layers - 1}")
            if site.kind in STACK_SITES and model.cross_heads is None:
                raise ConfigError(KEY, name, "this stack has no cross-attention")
            if not model.cfg.mlp and site.kind.startswith("mlp"):
                raise ConfigError(KEY, name, "this model has no MLPs (model.mlp=false)")

    def at(self, site: Site, x: Tensor) -> Tensor:
        """x after the site's hooks, cached when asked."""
        hooks = self.hooks.get(site, ())
        if self.stack is not None and (hooks or site in self.cached_sites):
            site, looked_up = self.named(site), site
        else:
            looked_up = site
        for fn in hooks:
            x = run_hook(fn, x, site)
        if looked_up in self.cached_sites:
            self.cache[site.name] = x
        return x


def as_site(name: str | Site) -> Site:
    return name if isinstance(name, Site) else parse_site(name)


def run_hook(fn: Hook, x: Tensor, site: Site) -> Tensor:
    try:
        out = fn(x, site)
    except ConfigError:
        raise
    except Exception as error:  # the user's code: one line naming the site, the original error chained
        reason = (str(error).strip().splitlines() or [""])[0]
        raise ConfigError(
            KEY, site.name, f"its hook {hook_name(fn)} raised {type(error).__name__}: {reason}"
        ) from error
    if out is None:
        return x
    if not isinstance(out, Tensor) or out.shape != x.shape:
        got = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
        allowed = f"its hook {hook_name(fn)} returned {got}; a hook returns None or a tensor of shape {tuple(x.shape)}"
        raise ConfigError(KEY, site.name, allowed)
    return out


def hook_name(fn: Hook) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__name__


def replace(value: Tensor | Callable[[], Tensor]) -> Hook:
    """A hook that puts value (broadcast to the site's shape) in place of the activation."""

    def replacing(x: Tensor, site: Site) -> Tensor:
        return torch.broadcast_to(value.to(x.dtype), x.shape)

    return replacing


def add(value: Tensor) -> Hook:
    """A hook that adds value (broadcastable to the site's shape), e.g. a steering vector (C,) to the stream."""

    def adding(x: Tensor, site: Site) -> Tensor:
        return x + value.to(x.dtype)

    return adding


def keep(into: dict[str, Tensor]) -> Hook:
    """A hook that records the activation as it reaches it, under the site's name, and changes nothing: placed before
    another hook of the same site, it keeps what that hook received (the z before the gates)."""

    def keeping(x: Tensor, site: Site) -> None:
        into[site.name] = x

    return keeping


def reads(kinds: Iterable[str], layers: Iterable[int], hooks: Iterable[tuple[str | Site, Hook]] = ()) -> Intervention:
    """An intervention that caches the sites `kinds` of every layer in `layers` (and applies `hooks`): how a caller
    keeps the stream into each layer, each head's z or the attention patterns (attn.pattern takes the explicit
    attention path, which computes them)."""
    return Intervention(hooks, [Site(kind, layer) for layer in layers for kind in kinds])


@dataclass(frozen=True, eq=False)
class Gates:
    """Head gates as a hook at attn.z: z_h <- g z_h + (1 - g) r_h at layer l with g = gates[..., l, h]; with
    site="cross.z", at a decoder stack's cross-attention heads instead (an encoder-decoder's `cross` kind).

    gates: (L, H) or (B, L, H) in [0, 1] (H the model's largest head count; per-example gates run many masks in one
    batched forward), replacements: one tensor per layer broadcastable to z (B, T, H, D), or None (zero ablation),
    where: (B, T), the positions the gates act at (None: all; elsewhere every head keeps its z). The arithmetic is
    MultiHeadAttention.gate_z's, the one place it is written."""

    gates: Tensor
    replacements: list[Tensor | None] | None = None
    where: Tensor | None = None
    site: str = "attn.z"  # the heads' site kind: attn.z, or cross.z for cross-attention heads
    key: str = "gates"  # the name its errors give the gates

    def __call__(self, z_BTHD: Tensor, site: Site) -> Tensor:
        layer = site.layer
        replacement = None if self.replacements is None else self.replacements[layer]
        return MultiHeadAttention.gate_z(z_BTHD, self.gates[..., layer, : z_BTHD.shape[2]], replacement, self.where)

    def hooks(self, start: int = 0) -> list[tuple[Site, Hook]]:
        """This hook at the site (attn.z or cross.z) of layers start..L-1."""
        return [(Site(self.site, layer), self) for layer in range(start, self.gates.shape[-2])]

    def check(self, model, batch: int) -> None:
        heads = model.cross_heads if self.site in STACK_SITES else model.max_heads
        if heads is None:
            raise ConfigError(self.key, self.site, "this stack has no cross-attention heads")
        shape = (model.n_layers, heads)
        gates = self.gates
        batch_ok = gates.ndim == 2 or (gates.ndim == 3 and gates.shape[0] == batch)
        if not batch_ok or tuple(gates.shape[-2:]) != shape:
            allowed = f"allowed shapes: {shape} or ({batch}, {shape[0]}, {shape[1]})"
            raise ConfigError(self.key, tuple(gates.shape), allowed)
        # A data-dependent check would break the graph under torch.compile; eager calls still get it.
        if not torch.compiler.is_compiling() and not bool(((gates >= 0) & (gates <= 1)).all()):
            raise ConfigError(self.key, "values outside [0, 1]", "every gate must lie in [0, 1]")


def gated(
    gates: Tensor,
    replacements: list[Tensor | None] | None = None,
    where: Tensor | None = None,
    start: int = 0,
    hooks: Iterable[tuple[str | Site, Hook]] = (),
    cache: Iterable[str | Site] = (),
    site: str = "attn.z",
) -> Intervention:
    """The intervention of head gates (`Gates`) from layer `start` on, after `hooks` at the same sites, with `cache`;
    site: the heads' site kind (cross.z: a decoder stack's cross-attention heads)."""
    return Intervention([*hooks, *Gates(gates, replacements, where, site).hooks(start)], cache)
