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
"""

from collections.abc import Callable, Iterable

import torch
from torch import Tensor

from headcount.errors import ConfigError
from headcount.model.sites import KEY, Site, parse_site

Hook = Callable[[Tensor, Site], Tensor | None]


class Intervention:
    def __init__(self, hooks: Iterable[tuple[str | Site, Hook]] = (), cache: Iterable[str | Site] = ()):
        self.hooks: dict[Site, list[Hook]] = {}
        for name, fn in hooks:
            if not callable(fn):
                raise ConfigError(
                    KEY, str(name), f"a hook must be callable (tensor, site) -> tensor or None, not {fn!r}"
                )
            self.hooks.setdefault(as_site(name), []).append(fn)
        self.cached_sites: set[Site] = {as_site(name) for name in cache}
        self.cache: dict[str, Tensor] = {}
        self.sites = set(self.hooks) | self.cached_sites
        self.layers = {site.layer for site in self.sites}

    def with_reads(self, sites: list[Site]) -> "Intervention":
        """This intervention with these sites read too, into its own cache (the hooks and the cache dict shared)."""
        both = Intervention()
        both.hooks, both.cache = self.hooks, self.cache
        both.cached_sites = self.cached_sites | set(sites)
        both.sites = set(both.hooks) | both.cached_sites
        both.layers = {site.layer for site in both.sites}
        return both

    def __bool__(self) -> bool:
        return bool(self.sites)

    def touches(self, layer: int | None) -> bool:
        """Whether any site of this layer (None: the model's own sites) is asked for."""
        return layer in self.layers

    def wants(self, site: Site) -> bool:
        return site in self.sites

    def check_layers(self, n_layers: int, mlp: bool) -> None:
        """ConfigError for a site the model does not have (a layer past its last, an MLP site of an attention-only
        model)."""
        for site in self.sites:
            if site.layer is not None and site.layer >= n_layers:
                raise ConfigError(KEY, site.name, f"this model has layers 0..{n_layers - 1}")
            if not mlp and site.kind.startswith("mlp"):
                raise ConfigError(KEY, site.name, "this model has no MLPs (model.mlp=false)")

    def at(self, site: Site, x: Tensor) -> Tensor:
        """x after the site's hooks, cached when asked."""
        for fn in self.hooks.get(site, ()):
            x = run_hook(fn, x, site)
        if site in self.cached_sites:
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
