"""The commands: headcount-train, headcount-ablate and headcount-report, and what Hydra's multirun calls back."""
