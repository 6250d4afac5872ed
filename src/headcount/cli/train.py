"""`headcount-train [-m] <overrides>`: train, run the ablation scans, then check the finding, for a run or a sweep."""

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig
from rich.console import Console
from rich.markup import escape

from headcount import run_lock
from headcount.cli.errors import discarded_if_rejected, exit_on_config_error, print_error, run_hydra_command
from headcount.cli.sweep import check_launcher_installed, register_resolvers, skipped_finding
from headcount.components import take_list_flag
from headcount.config import CONF_DIR, register_configs, typed
from headcount.config.ablation import unselected_scans_dropped
from headcount.config.train import TrainerConfig, check_devices_here
from headcount.run_dir import is_done, mark_done
from headcount.train import peers
from headcount.train.quiet import take_verbosity_flags

if TYPE_CHECKING:
    from headcount.ablation.records.address import ResultAddress

# Torch, Lightning and the stages load inside the functions that start work, not here: composing, checking (the
# config's component names against registry.py's index: cli/sweep.py) and --list answer at once (docs/BENCHMARKS.md,
# tests/test_cli_imports.py).


def run(cfg: DictConfig, run_dir: Path) -> None:
    """The whole job for one run directory: validate, train, ablate, mark DONE. Skips a run that is already DONE."""
    from lightning.fabric.utilities.rank_zero import rank_zero_only

    from headcount.ablation import run_ablations
    from headcount.cli.preflight import validate_job
    from headcount.pretrained.run_config import resolve_pretrained
    from headcount.report.tracking import log_run_results
    from headcount.train.job import train
    from headcount.train.launch import ddp_confined_to_this_job, own_gpu_in_a_sweep
    from headcount.train.loggers import closing_wandb_run

    console = Console(stderr=True)
    if is_done(run_dir):
        console.print(f"[green]already finished:[/green] {escape(str(run_dir))} (delete DONE to rerun)", soft_wrap=True)
        return
    check_devices_here(typed(cfg.trainer, TrainerConfig))  # what this machine has: not a check of the config alone
    peers.observe_children()
    validate_job(cfg)
    cfg = resolve_pretrained(cfg)  # the model the checkpoint implies (read once per process)
    with closing_wandb_run(), own_gpu_in_a_sweep(cfg), ddp_confined_to_this_job():
        metrics = train(cfg, run_dir)
        if cfg.ablation.scans:  # over the processes that trained (rank 0 alone writes: ablation/records/distributed.py)
            run_ablations(cfg, run_dir)
        if rank_zero_only.rank != 0:
            return  # DDP's other processes: rank 0 alone logs the results and writes DONE
        if cfg.logger.kind == "wandb":
            log_run_results(run_dir, metrics)
        mark_done(run_dir)
    print_run_summary(console, run_dir, metrics)


def print_run_summary(console: Console, run_dir: Path, metrics: dict) -> None:
    """The end of a run: what was trained and measured, the headline numbers of the run's ablation mode and metric
    (on its task, if it names one), and the files written."""
    from headcount.ablation.records.address import run_address
    from headcount.ablation.records.summary import read_summary

    resumed = " (resumed)" if metrics.get("resumed_from_step") is not None else ""
    # trainer.max_steps=0 (a pretrained model evaluated as it is) trains nothing
    trained = f"trained {metrics['steps']:,} steps in {metrics['train_seconds']:.0f} s{resumed}"
    console.print(
        f"[bold]{trained if metrics['steps'] else 'evaluated as it is (no training)'}[/bold]: "
        f"{metrics['params']:,} parameters"
        + (
            ""
            if metrics["flops_per_token"] is None
            else f", {metrics['flops_per_token']:,.0f} training FLOPs per token"
        ),
        highlight=False,
        soft_wrap=True,
    )
    measured = [key for key in ("val/loss", "val/acc", "test/loss", "test/acc") if key in metrics]
    numbers = "  ".join(f"{key} {metrics[key]:.4f}" for key in measured)
    console.print(f"[bold]measured[/bold] {numbers} (per target token)", highlight=False, soft_wrap=True)
    address = run_address(run_dir)
    if said := ablation_headline(read_summary(address.summary_path), address):
        console.print(f"[bold]ablated[/bold] {said}", highlight=False, soft_wrap=True)
    console.print(f"[green]wrote[/green] {escape(str(run_dir))}", soft_wrap=True)
    written = (p for p in run_dir.rglob("*") if p.suffix in {".json", ".csv", ".png", ".ckpt"})
    for path in sorted(p.relative_to(run_dir) for p in written):
        if path.parts[0] != "wandb":  # W&B's own files are many; `wandb sync` reads them
            console.print(f"  {path}")


def ablation_headline(summary: dict, address: "ResultAddress") -> str | None:
    """The scans of the run's section (at the address its config asks for) and their headline numbers, in one line;
    None when no scan ran."""
    from headcount.ablation.engine.metrics import metric_named
    from headcount.ablation.records.summary import SHARED, mode_summary

    section = mode_summary(summary, address.section)
    scans = [*section.get("scans", {}), *summary.get(SHARED, {}).get("scans", {})]
    if not scans:
        return None
    settings = section.get("settings", {})
    ablation_mode, metric = address.mode, address.metric
    where = f"{settings.get('n_eval')} {settings.get('split')} examples"
    if "task" in settings:
        where = f"{settings.get('n_eval')} prompts of task {settings['task']}"
    said = [f"{', '.join(scans)} ({ablation_mode} ablation, {where})"]
    primary = metric_named(metric).primary
    if (baseline := section.get(f"baseline_{primary}")) is not None:
        said.append(f"baseline {metric} {baseline:.4f}")
    if head := section.get("most_important_head"):
        change = head.get(f"delta_{primary}", 0.0)
        said.append(f"most important head {head['mask']} ({metric} {change:+.4f} without it)")
    if fractions := section.get("prunable_fraction"):
        arbitrary = set(section.get("arbitrary_orders", []))
        said.append(
            "prunable "
            + ", ".join(
                f"{fraction:.0%} by {order}{' (arbitrary order)' if order in arbitrary else ''}"
                for order, fraction in fractions.items()
            )
        )
    return "; ".join(said)


register_configs()
register_resolvers()


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="train")
@exit_on_config_error
def train_job(cfg: DictConfig) -> None:
    from lightning.fabric.utilities.rank_zero import rank_zero_only

    from headcount.findings import check_finding, reads_sweep

    run_dir = Path(HydraConfig.get().runtime.output_dir)
    unselected_scans_dropped(cfg)
    try:
        with discarded_if_rejected(run_dir):
            run(cfg, run_dir)
        finding = cfg.finding
        if finding is not None and not reads_sweep(finding) and rank_zero_only.rank == 0:
            if skipped_finding(finding, list(cfg.ablation.scans)):
                return
            written = check_finding(finding, run_dir)
            Console(stderr=True).print(f"[green]wrote[/green] {escape(str(written))}", soft_wrap=True)
    finally:
        # However the job ends: a worker process of a sweep's launcher (joblib) lives on after its job
        run_lock.release(run_dir)


def main() -> None:
    """`headcount-train [-v|-vv] [-m] <overrides>`: -v brings back Lightning's own output and warnings, -vv debug logs
    too (train/quiet.py). A missing launcher plugin is reported before Hydra reads any config."""
    sys.argv = [sys.argv[0], *take_verbosity_flags(take_list_flag(sys.argv[1:]))]
    exit_on_config_error(check_launcher_installed)(sys.argv[1:])
    peers.watch(print_error, run_lock.release_all)
    run_hydra_command(train_job)


if __name__ == "__main__":
    main()
