"""`python scripts/ablate.py run_dir=<run> ...` is `headcount-ablate run_dir=<run> ...`."""

from headcount.cli.ablate import main

if __name__ == "__main__":
    main()
