"""The figures a finding adds to the scan figures: each puts the paper's claim and our numbers on one set of axes, with
units on the axes and the model, the data and the ablation mode (`subject`) under its title."""

from pathlib import Path

import pandas as pd
from matplotlib.ticker import ScalarFormatter

from headcount.ablation.engine.heads import head_name
from headcount.io import atomic_savefig
from headcount.plotting import new_figure


def suptitle(fig, title: str, subject: str) -> None:
    fig.suptitle(f"{title}\n{subject}" if subject else title, fontsize=9)


def label_points(ax, xs, ys, labels) -> None:
    for x, y, text in zip(xs, ys, labels):
        ax.annotate(text, (x, y), textcoords="offset points", xytext=(4, 3), fontsize=8)


def scores_against_ablation(heads: pd.DataFrame, path: Path, critical: float, subject: str = "") -> Path:
    """Two panels: layer 0's heads by previous-token score, layer 1's by induction score, each against the loss its
    single ablation costs; a dashed line at the critical loss increase."""
    fig = new_figure(10, 4)
    panels = [(0, "prev_token_score", "previous-token score"), (1, "induction_score", "induction score")]
    for i, (layer, score, label) in enumerate(panels):
        ax = fig.add_subplot(1, 2, i + 1)
        rows = heads[heads.layer == layer]
        ax.scatter(rows[score], rows.delta_loss, color="tab:blue")
        label_points(ax, rows[score], rows.delta_loss, [head_name(layer, h) for h in rows["head"]])
        ax.axhline(critical, color="grey", linestyle="--", linewidth=1, label=f"{critical:g} nat")
        ax.set(
            xlim=(0, 1),
            xlabel=f"{label} (share of attention)",
            ylabel="repeated-part loss increase when zeroed (nats)",
        )
        ax.set_title(f"layer {layer}", fontsize=9)
        ax.legend(loc="upper left")
    suptitle(fig, "Attention-pattern scores against the cost of zeroing each head", subject)
    atomic_savefig(fig, path, dpi=120)
    return path


def sixteen_heads_panels(
    single_rel: pd.Series, keep_one_rel: pd.Series, little: float, path: Path, subject: str = ""
) -> Path:
    """Left: each head's relative loss increase when removed alone, sorted; right: each layer's increase when only
    its best head is kept. Dashed: the 1% bar."""
    fig = new_figure(11, 4)
    ax = fig.add_subplot(1, 2, 1)
    ordered = single_rel.sort_values().to_numpy()
    ax.bar(range(len(ordered)), 100 * ordered, color="tab:blue")
    ax.axhline(100 * little, color="grey", linestyle="--", linewidth=1, label=f"{100 * little:g}%")
    ax.set(xlabel="heads, sorted", ylabel="loss increase (%)", title="one head removed")
    ax.set_yscale("symlog", linthresh=1)
    ax.legend()
    ax = fig.add_subplot(1, 2, 2)
    ax.bar(keep_one_rel.index.astype(str), 100 * keep_one_rel.to_numpy(), color="tab:orange")
    ax.axhline(100 * little, color="grey", linestyle="--", linewidth=1)
    ax.set(xlabel="layer", ylabel="loss increase (%)", title="all heads but the best one removed, per layer")
    ax.set_yscale("symlog", linthresh=1)
    suptitle(fig, "Loss increase over the full model (%), symmetric-log axis", subject)
    atomic_savefig(fig, path, dpi=120)
    return path


def l0_against_pruning(
    l0: pd.DataFrame, curves: pd.DataFrame, n_heads: int, baseline: float, path: Path, subject: str = ""
) -> Path:
    """Loss against heads kept: the L0 gate runs as points, the gradient-importance and random pruning curves as
    lines (random: mean with a min-max band over seeds)."""
    fig = new_figure(7, 4.5)
    ax = fig.add_subplot()
    for order, curve in curves.groupby("order", sort=False):
        by_kept = curve.assign(kept=n_heads - curve.n_pruned).groupby("kept")["loss"]
        mean = by_kept.mean()
        (line,) = ax.plot(mean.index, mean.to_numpy(), marker="o", markersize=3, label=f"pruning: {order}")
        if curve["seed"].nunique() > 1:
            ax.fill_between(mean.index, by_kept.min(), by_kept.max(), color=line.get_color(), alpha=0.2)
    ax.scatter(l0.n_kept, l0.loss, color="black", marker="*", s=90, zorder=3, label="L0 gates")
    label_points(ax, l0.n_kept, l0.loss, [f"target {t}" for t in l0.target_heads])
    ax.axhline(baseline, color="grey", linestyle="--", linewidth=1, label="all heads")
    ax.set(xlabel="heads kept", ylabel="loss (nats, log scale)")
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(ScalarFormatter())  # plain loss values, not powers of ten
    ax.yaxis.set_minor_formatter(ScalarFormatter())
    ax.legend()
    suptitle(fig, "L0 gates against pruning orders", subject)
    atomic_savefig(fig, path, dpi=120)
    return path


def loss_against_heads(loss: pd.Series, path: Path, subject: str = "") -> Path:
    """A panel per dataset: mean test loss against heads per layer (log scale), a line per head width."""
    datasets = loss.index.get_level_values(0).unique()
    fig = new_figure(5 * len(datasets), 4)
    for i, data in enumerate(datasets):
        ax = fig.add_subplot(1, len(datasets), i + 1)
        for width, curve in loss[data].groupby(level=0):
            heads = curve.index.get_level_values(1)
            ax.plot(heads, curve.to_numpy(), marker="o", label=f"head width: {width}")
        ax.set_xscale("log", base=2)
        ax.set(xlabel="heads per layer (log scale)", ylabel="test loss (nats, mean over seeds)", title=data)
        ax.legend()
    suptitle(fig, "Test loss against heads per layer", subject)
    atomic_savefig(fig, path, dpi=120)
    return path


def combine_bars(loss: pd.Series, prunable: pd.Series, path: Path, subject: str = "") -> Path:
    """Two panels of grouped bars, a group per dataset and a bar per (combine, head width): test loss, and the
    fraction of heads prunable in gradient order."""
    fig = new_figure(11, 4)
    panels = [
        (loss, "test loss (nats, mean over seeds)"),
        (prunable, "prunable in gradient order (fraction of heads)"),
    ]
    for i, (values, label) in enumerate(panels):
        ax = fig.add_subplot(1, 2, i + 1)
        table = values.unstack("data")
        n = len(table)
        for j, ((combine, width), row) in enumerate(table.iterrows()):
            offsets = [k + (j - (n - 1) / 2) * 0.8 / n for k in range(len(row))]
            ax.bar(offsets, row.to_numpy(), width=0.8 / n, label=f"{combine}, {width}d")
        ax.set_xticks(range(len(table.columns)), table.columns)
        ax.set(ylabel=label)
        ax.legend(fontsize=8)
    suptitle(fig, "Concatenated against summed heads", subject)
    atomic_savefig(fig, path, dpi=120)
    return path


def pretrained_panels(
    single_rel: pd.Series,
    repeat_losses: dict[str, list[float]],
    kv_costs: pd.DataFrame,
    little: float,
    path: Path,
    subject: str = "",
) -> Path:
    """Three panels: each head's relative loss increase when removed alone, sorted, with the 1% bar; the repeated
    half's loss of repeated random tokens under each ablation (a bar per entry, its mean, with the draws as points);
    each key/value group's loss increase against its query heads' single increases added up, with the diagonal."""
    fig = new_figure(15, 4.5)
    ax = fig.add_subplot(1, 3, 1)
    ordered = single_rel.sort_values().to_numpy()
    ax.bar(range(len(ordered)), 100 * ordered, color="tab:blue", width=1.0)
    ax.axhline(100 * little, color="grey", linestyle="--", linewidth=1, label=f"{100 * little:g}%")
    ax.set(xlabel="heads, sorted", ylabel="loss increase (%, symmetric log)", title="one head zeroed, on code")
    ax.set_yscale("symlog", linthresh=1)
    ax.legend()
    ax = fig.add_subplot(1, 3, 2)
    for i, losses in enumerate(repeat_losses.values()):
        ax.bar(i, sum(losses) / len(losses), color="tab:orange")
        ax.scatter([i] * len(losses), losses, color="black", s=12, zorder=3)
    ax.set_xticks(range(len(repeat_losses)), list(repeat_losses), fontsize=8)
    ax.set(ylabel="loss on the repeated half (nats per token)", title="in-context copying of random tokens")
    ax = fig.add_subplot(1, 3, 3)
    ax.scatter(kv_costs.single_sum, kv_costs.delta_loss, color="tab:green", s=14)
    low = min(kv_costs.single_sum.min(), kv_costs.delta_loss.min(), 0.0)
    high = max(kv_costs.single_sum.max(), kv_costs.delta_loss.max(), 1e-6)
    ax.plot([low, high], [low, high], color="grey", linestyle="--", linewidth=1, label="group = sum of its heads")
    ax.set(
        xlabel="its query heads zeroed one at a time, added up (nats)",
        ylabel="key/value group zeroed (nats)",
        title="key/value groups against their heads",
    )
    ax.legend(fontsize=8)
    suptitle(fig, "Heads of a pretrained model", subject)
    atomic_savefig(fig, path, dpi=120)
    return path


def translation_pruning(curves: pd.DataFrame, base_bleu: float, path: Path, subject: str = "") -> Path:
    """BLEU against the share of heads pruned, one line per order (each kind alone, every head, random)."""
    fig = new_figure(6, 4)
    ax = fig.add_subplot(1, 1, 1)
    for order, curve in curves.groupby("order", sort=False):
        ax.plot(curve.fraction, curve.bleu, marker="o", markersize=3, label=order)
    ax.axhline(base_bleu - 1, color="grey", linestyle="--", linewidth=1, label="1 BLEU below the full model")
    ax.set(xlabel="share of the order's heads zeroed", ylabel="BLEU of greedy translations", xlim=(0, 1))
    ax.legend(fontsize=8)
    suptitle(fig, "Heads pruned in gradient-importance order (Michel et al. 2019)", subject)
    atomic_savefig(fig, path, dpi=120)
    return path
