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
# # A first head-ablation study: the quickstart's induction heads
#
# We train the quickstart's model (2 attention-only layers x 4 heads on the `induction` task: a random segment, then
# the same segment again), switch its heads off one at a time and by layer, read what each head attends to, and
# check which heads the model needs. Run it from a clone's root (`jupyter lab docs/tutorials/`, or open it with
# jupytext).
#
# The parameters below are the quickstart's (4,000 steps, 2-3 minutes on 2 CPU cores). The test suite runs this
# notebook with `SIZE = ["size=smoke"]`: 4 steps, seconds, a model that has learned nothing (its numbers say so).

# %% tags=["parameters"]
SIZE: list[str] = []  # extra overrides; ["size=smoke"] runs in seconds and learns nothing
RUN_DIR = "outputs/tutorials/first_study"

# %% [markdown]
# ## Train and scan
#
# One command trains, evaluates and runs the scans named in `ablation`: the unmasked baseline, every head off alone,
# every layer off, and each head's previous-token and induction score read off its attention pattern.

# %%
import subprocess

command = [
    "headcount-train",
    "experiment=induction_heads",
    "ablation=[baseline,single_head,layer,head_scores]",
    "trainer.progress_bar=false",
    f"hydra.run.dir={RUN_DIR}",
    *SIZE,
]
done = subprocess.run(command, capture_output=True, text=True)
said = (done.stdout + done.stderr).splitlines()
print("\n".join(line for line in said if any(word in line for word in ("trained ", "measured ", "ablated "))))
assert done.returncode == 0, done.stderr[-2000:]

# %% [markdown]
# ## Open the run
#
# `headcount.load_run` reads everything from the run directory: the model (in eval mode), its config, its metrics and
# the evaluation batches every scan used.

# %%
import math

import headcount

run = headcount.load_run(RUN_DIR)
vocab = run.config.data.vocab_size
print(run)
print(
    f"test loss {run.metrics['test/loss']:.3f} nats a token; a guess costs ln({vocab - 1}) = {math.log(vocab - 1):.2f}"
)

# %% [markdown]
# ## Which heads matter alone?
#
# `run.results` reads a scan's tables; `delta_loss` is how much the loss rises with that head zeroed.

# %%
single = run.results("single_head")
single.pivot(index="layer", columns="head", values="delta_loss").round(3)

# %% [markdown]
# ## What do the heads attend to?
#
# A previous-token head attends from each token to the one before it; an induction head attends to the token after
# the current token's earlier occurrence. In the trained model the two roles sit in different layers.

# %%
scores = run.results("head_scores")
scores[["layer", "head", "prev_token_score", "induction_score"]].round(2)

# %% [markdown]
# ## Roles together
#
# Heads of one role back each other up, so zero each role's heads together, beside the other heads together:
# `run.evaluate` scores any masks exactly, as a scan would, and writes nothing.

# %%
prev_token = scores[scores.layer == 0].nlargest(2, "prev_token_score")
induction = scores[scores.layer == 1].nlargest(2, "induction_score")
roles = {
    "previous-token heads": [(int(r.layer), int(r.head)) for r in prev_token.itertuples()],
    "induction heads": [(int(r.layer), int(r.head)) for r in induction.itertuples()],
}
every = [(layer, head) for layer in range(run.model.n_layers) for head in range(run.model.max_heads)]
roles["the other heads"] = [h for h in every if h not in roles["previous-token heads"] + roles["induction heads"]]
together = run.evaluate(roles)
together[["mask", "n_heads_off", "loss", "delta_loss"]]

# %% [markdown]
# ## Zero against mean ablation
#
# Zeroing a head's output moves the stream where it never goes; mean ablation replaces it with its average output.
# The same masks in mean mode:

# %%
mean = run.evaluate(roles, mode="mean")
together[["mask"]].assign(zero=together.delta_loss, mean=mean.delta_loss)

# %% [markdown]
# At the quickstart's size (seed 0) each role's heads together cost several nats while the other heads together cost
# a fraction of one (docs/REPRODUCTIONS.md has the numbers). Next: the
# Ablations and modes guide page for every scan kind, and Circuits page for how the two
# roles connect.
