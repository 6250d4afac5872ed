"""`python scripts/ablate.py run_dir=<run> ...` is `headcount-ablate run_dir=<run> ...`."""

from headcount.ablation.cli import main

if __name__ == "__main__":
    main()
