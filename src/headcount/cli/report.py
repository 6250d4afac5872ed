"""`headcount-report <multirun dir> [--wandb]`: the sweep report of report/sweep_report.py, from the command line."""

import argparse
import sys
from pathlib import Path

from headcount.cli.errors import fault_line, print_error
from headcount.config.logger import validate_wandb_project
from headcount.errors import ConfigError
from headcount.io import write_fault
from headcount.report.runs import sweep_runs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="headcount-report", description="Compare the runs of a sweep (a multirun folder)."
    )
    parser.add_argument("sweep_dir", type=Path, help="a multirun folder, e.g. outputs/multirun/<sweep_name>")
    parser.add_argument(
        "--wandb", action="store_true", help="also log the report to W&B (offline unless an API key is set)"
    )
    parser.add_argument("--project", help="W&B project (default: the one the runs were logged to)")
    parser.add_argument(
        "--out", type=Path, help="where to write the report (default: <sweep_dir>/report; a read-only sweep needs one)"
    )
    args = parser.parse_args(argv)
    try:
        sweep_runs(args.sweep_dir)  # a folder without runs answers before pandas, torch and the readers load
        from headcount.report.sweep_report import print_summary, push_to_wandb, wandb_project_of, write_report

        out, runs, figures = write_report(args.sweep_dir, args.out)
        print_summary(out, runs)
        if args.wandb:
            project = args.project or wandb_project_of(runs, args.sweep_dir)
            validate_wandb_project(project)
            push_to_wandb(out, runs, figures, project, group=args.sweep_dir.resolve().name)
    except ConfigError as e:
        print_error(str(e))
        sys.exit(2)
    except OSError as e:
        if write_fault(e) is None:
            raise
        print_error(fault_line(e))
        sys.exit(1)


if __name__ == "__main__":
    main()
