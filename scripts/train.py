"""Same as `headcount-train`: train a model from the Hydra config, then run its ablation scans."""

from headcount.cli.train import main

if __name__ == "__main__":
    main()
