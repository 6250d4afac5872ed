"""`headcount-train [-m] <overrides>`: train, run the ablation scans, then check the finding, for a run or a sweep."""

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from lightning.fabric.utilities.rank_zero import rank_zero_only
from omegaconf import DictConfig
from rich.console import Console
from rich.markup import escape

from headcount import run_lock
from headcount.ablation import run_ablations
from headcount.cli.errors import discarded_if_rejected, exit_on_config_error, run_hydra_command
from headcount.cli.preflight import validate_job
from headcount.cli.sweep import check_launcher_installed, register_resolvers, skipped_finding
from headcount.config import CONF_DIR, register_configs
from headcount.findings import check_finding, reads_sweep
from headcount.report.tracking import log_run_results
from headcount.run_dir import is_done, mark_done
from headcount.train.job import train
from headcount.train.launch import ddp_confined_to_this_job, own_gpu_in_a_sweep
from headcount.train.loggers import closing_wandb_run


def run(cfg: DictConfig, run_dir: Path) -> None:
    """The whole job for one run directory: validate, train, ablate, mark DONE. Skips a run that is already DONE."""
    console = Console(stderr=True)
    if is_done(run_dir):
        console.print(f"[green]already finished:[/green] {escape(str(run_dir))} (delete DONE to rerun)")
        return
    validate_job(cfg)
    with closing_wandb_run(), own_gpu_in_a_sweep(cfg), ddp_confined_to_this_job():
        metrics = train(cfg, run_dir)
        if rank_zero_only.rank != 0:
            return  # DDP children: rank 0 alone runs the ablations and writes the results and DONE
        if cfg.ablation.scans:
            run_ablations(cfg, run_dir)
        if cfg.logger.kind == "wandb":
            log_run_results(run_dir, metrics)
        mark_done(run_dir)
    console.print(f"[bold]val/loss[/bold] {metrics['val/loss']:.4f}  [bold]test/loss[/bold] {metrics['test/loss']:.4f}")
    console.print(f"[green]wrote[/green] {escape(str(run_dir))}")
    written = (p for p in run_dir.rglob("*") if p.suffix in {".json", ".csv", ".png", ".ckpt"})
    for path in sorted(p.relative_to(run_dir) for p in written):
        if path.parts[0] != "wandb":  # W&B's own files are many; `wandb sync` reads them
            console.print(f"  {path}")


register_configs()
register_resolvers()


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="train")
@exit_on_config_error
def train_job(cfg: DictConfig) -> None:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
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
    """`headcount-train [-m] <overrides>`: a missing launcher plugin is reported before Hydra reads any config."""
    exit_on_config_error(check_launcher_installed)(sys.argv[1:])
    run_hydra_command(train_job)


if __name__ == "__main__":
    main()
