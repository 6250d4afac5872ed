# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Your own configurable-attention sweep
#
# Does a model need many heads, and does it matter whether heads are concatenated (as in every modern transformer) or
# summed through one shared projection (as in the first Transformer)? We sweep heads per layer x how heads combine x
# seeds on byte-level text (the Python standard library's source, no download), ablate every head of every run, and
# read the sweep's report.
#
# The parameters below are the guide's sweep (the Sweeps guide page: 12 runs,
# about 7.5 minutes on 2 CPU cores). The test suite runs this notebook at 2 runs of 4 steps (`size=smoke`): seconds,
# numbers that mean nothing.

# %% tags=["parameters"]
N_HEADS = "1,2,4"
COMBINE = "concat,sum"
SEEDS = "0,1"
STEPS = 500
SIZE: list[str] = []  # extra overrides; ["size=smoke"] runs in seconds and learns nothing
SWEEP = "tutorial_sweep"

# %% [markdown]
# ## Launch
#
# `-m` sweeps every combination of the comma-separated values; each job trains, runs its scans and writes its own run
# directory under `outputs/multirun/<sweep_name>/`, named by what sets it apart. Every job is composed and checked
# before the first one starts, and the same command again resumes an interrupted sweep.

# %%
import subprocess

sweep = [
    "headcount-train",
    "-m",
    "model=tiny",
    "data=pystdlib",
    f"model.attn.n_heads={N_HEADS}",
    f"model.attn.combine={COMBINE}",
    f"seed={SEEDS}",
    f"trainer.max_steps={STEPS}",
    f"trainer.val_check_interval={STEPS}",
    "trainer.progress_bar=false",
    "ablation=[baseline,single_head,pruning]",
    f"sweep_name={SWEEP}",
    *SIZE,
]
done = subprocess.run(sweep, capture_output=True, text=True)
assert done.returncode == 0, done.stderr[-2000:]
print(done.stdout[-600:])

# %% [markdown]
# ## Report
#
# `headcount-report` reads the run directories alone and writes `report/runs.csv` (one row per run), `report.md`
# (means over seeds) and figures.

# %%
report = subprocess.run(["headcount-report", f"outputs/multirun/{SWEEP}"], capture_output=True, text=True)
assert report.returncode == 0, report.stderr[-2000:]

import pandas as pd

runs = pd.read_csv(f"outputs/multirun/{SWEEP}/report/runs.csv")
runs.filter(regex="n_heads|combine|seed|params|test/loss|prunable").round(3)

# %% [markdown]
# ## One run up close
#
# Each job's folder is a run like any other: `headcount.load_run` opens it, here the run with the most heads.

# %%
from pathlib import Path

import headcount

folders = sorted(p.parent for p in Path(f"outputs/multirun/{SWEEP}").glob("*/DONE"))
runs_by_heads = {headcount.load_run(folder).config.model.attn.n_heads: folder for folder in folders}
run = headcount.load_run(runs_by_heads[max(runs_by_heads)])
run.results("single_head")[["mask", "delta_loss"]].sort_values("delta_loss", ascending=False)

# %% [markdown]
# With one head, concatenating and summing heads are the same model, and their rows agree to the last digit. The
# Sweeps guide page shows the full sweep's table and figures, and how to run it on a SLURM cluster.
