"""The finding checkers: their verdicts on results with known answers, the reduced induction_heads experiment end to
end, and every experiment from the command line at smoke size."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from omegaconf import OmegaConf
from sweep_helpers import run_python, train_in_process

from headcount.errors import ConfigError
from headcount.findings import check_finding, validate_finding
from headcount.findings.claims import VERDICTS
from headcount.run_dir import RunPaths

REPO = Path(__file__).resolve().parents[1]


def fake_run(sweep: Path, overrides: dict, params: int, test_loss: float, prunable: float = 0.0) -> None:
    """A finished run directory as the report reads it: overrides, metrics.json, summary.json and DONE."""
    name = ",".join(f"{k}={v}" for k, v in overrides.items())
    run_dir = sweep / name
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "overrides.yaml").write_text(OmegaConf.to_yaml([f"{k}={v}" for k, v in overrides.items()]))
    (run_dir / "metrics.json").write_text(json.dumps({"params": params, "test/loss": test_loss}))
    (run_dir / "ablation").mkdir()
    summary = {"baseline_loss": test_loss, "prunable_fraction": {"gradient": prunable}}
    (run_dir / "ablation" / "summary.json").write_text(json.dumps(summary))
    (run_dir / "DONE").touch()


def verdicts(directory: Path) -> list[str]:
    return [claim["verdict"] for claim in json.loads((directory / "findings" / "findings.json").read_text())["claims"]]


def test_head_count_verdicts(tmp_path):
    # offset_diff: U-shaped at flat cost, fixed width helps; pystdlib: monotone, fixed width does not help
    flat = {
        "offset_diff": {1: 2.0, 2: 1.0, 4: 1.1, 8: 1.2, 16: 1.5},
        "pystdlib": {1: 2.0, 2: 1.9, 4: 1.8, 8: 1.7, 16: 1.6},
    }
    for data, losses in flat.items():
        for heads, loss in losses.items():
            for seed in (0, 1):
                common = {"data": data, "model.attn.n_heads": heads, "seed": seed}
                fake_run(tmp_path, {**common, "model.attn.head_dim": "null"}, 1000, loss + 0.01 * seed)
                fixed = loss - 0.2 if data == "offset_diff" else loss + 0.2
                fake_run(tmp_path, {**common, "model.attn.head_dim": 16}, 1000 * heads, fixed)
    check_finding("head_count", tmp_path)
    assert verdicts(tmp_path) == ["reproduced", "reproduced", "partly", "partly"]
    assert (tmp_path / "findings" / "head_count.png").stat().st_size > 0


def test_concat_vs_sum_verdicts(tmp_path):
    losses = {  # (combine, head_dim) -> loss; summed heads lose at equal width on both, the gap closes on one
        "offset_diff": {("concat", 8): 1.0, ("concat", 10): 0.9, ("sum", 8): 2.0, ("sum", 10): 1.2},
        "pystdlib": {("concat", 8): 1.0, ("concat", 10): 0.9, ("sum", 8): 1.1, ("sum", 10): 1.5},
    }
    for data, table in losses.items():
        for (combine, width), loss in table.items():
            overrides = {"data": data, "model.attn.combine": combine, "model.attn.head_dim": width, "seed": 0}
            fake_run(tmp_path, overrides, 100 * width, loss, prunable=0.25)
    check_finding("concat_vs_sum", tmp_path)
    assert verdicts(tmp_path) == ["reproduced", "partly"]
    numbers = json.loads((tmp_path / "findings" / "findings.json").read_text())["numbers"]
    assert numbers["test_loss"]["offset_diff"]["sum"]["8"] == 2.0


def test_unknown_finding_is_one_line():
    with pytest.raises(ConfigError, match="finding='nope': allowed: .*induction_heads.* \\(or null\\)$"):
        validate_finding("nope")


def induction_heads_table(rows: list[tuple[int, int, float, float, float]]) -> pd.DataFrame:
    """(layer, head, prev_token_score, induction_score, delta_loss) rows as findings/induction.py's head table."""
    return pd.DataFrame(rows, columns=["layer", "head", "prev_token_score", "induction_score", "delta_loss"])


def induction_claims(rows: list, joint: dict[tuple, float]) -> tuple[list[str], dict]:
    """The induction finding's five verdicts on a made-up head table; `joint` maps each set of heads the finding may
    zero together, as sorted (layer, head) pairs, to its loss increase (a set not listed fails the test)."""
    from headcount.findings.induction import claims_of

    claims, numbers = claims_of(induction_heads_table(rows), lambda heads: joint[tuple(sorted(heads))], 0.01, 12.0, 4.1)
    return [claim.verdict for claim in claims], numbers


# Seed 0 at two threads on this project's 2-core AMD EPYC: two layer-0 heads share the previous-token role (neither
# over 1 nat alone), two layer-1 heads the induction role. L0H0 scores 0.12, under the bar: never zeroed with them.
SHARED_ROLES = [
    (0, 0, 0.12, 0.05, 0.08),
    (0, 1, 0.04, 0.05, 0.04),
    (0, 2, 0.26, 0.04, 0.21),
    (0, 3, 0.26, 0.04, 0.43),
    (1, 0, 0.17, 0.09, 0.05),
    (1, 1, 0.03, 0.69, 0.05),
    (1, 2, 0.04, 0.71, 0.60),
    (1, 3, 0.03, 0.27, 0.00),
]
PATTERN, OTHERS = ((0, 2), (0, 3), (1, 1), (1, 2)), ((0, 0), (0, 1), (1, 0), (1, 3))  # SHARED_ROLES' two groups


def test_induction_claims_4_and_5_read_the_pattern_heads_together_when_no_head_matters_alone():
    """Seed 0 on an Intel Xeon (the device machine's CPU, 2026-11-26): the roles are shared so evenly that no head costs
    a nat alone. The per-head rules said not reproduced twice ("0 of 8 heads over 1 nat"); the pattern heads zeroed
    together (+7.05) against the others together (+0.07) reproduce both. A head outside the patterns that costs over a
    nat alone (seed 3's L0H0) still fails them, and the others costing over a nat together fails claim 4."""
    rows = [(layer, head, prev, ind, min(delta, 0.6)) for layer, head, prev, ind, delta in SHARED_ROLES]
    verdicts, numbers = induction_claims(
        rows, {((0, 2), (0, 3)): 6.42, ((1, 1), (1, 2)): 7.75, PATTERN: 7.05, OTHERS: 0.07}
    )
    assert numbers["critical_heads"] == [] and verdicts[3:5] == ["reproduced", "reproduced"]
    assert numbers["other_heads"] == ["L0H0", "L0H1", "L1H0", "L1H3"] and numbers["pattern_heads_joint_delta"] == 7.05
    rows[0] = (0, 0, 0.12, 0.05, 3.08)
    verdicts, _ = induction_claims(rows, {((0, 2), (0, 3)): 6.42, ((1, 1), (1, 2)): 7.75, PATTERN: 7.05, OTHERS: 2.2})
    assert verdicts[3:5] == ["not reproduced", "not reproduced"]
    verdicts, _ = induction_claims(
        rows[1:], {((0, 2), (0, 3)): 6.4, ((1, 1), (1, 2)): 7.7, PATTERN: 0.5, OTHERS[1:]: 0.1}
    )
    assert verdicts[3:5] == ["not reproduced", "not reproduced"]  # the pattern heads carry nothing together either


def test_induction_claims_zero_each_roles_pattern_heads_together():
    """Claims 2 and 3 read the heads the patterns single out, zeroed together: a role split between two heads that
    each cost under a nat alone is still reproduced (the rule of one head said not reproduced and partly)."""
    joint = {((0, 2), (0, 3)): 6.42, ((1, 1), (1, 2)): 7.75, PATTERN: 7.24, OTHERS: 0.15}
    verdicts, numbers = induction_claims(SHARED_ROLES, joint)
    assert verdicts[1:3] == ["reproduced", "reproduced"]
    assert numbers["prev_token_heads"] == ["L0H2", "L0H3"] and numbers["prev_token_heads_joint_delta"] == 6.42
    assert numbers["prev_token_head_deltas"] == {"L0H2": 0.21, "L0H3": 0.43}
    assert numbers["induction_heads"] == ["L1H1", "L1H2"] and numbers["top_induction_head"] == "L1H2"
    # together under a nat: not reproduced, however the heads score
    verdicts, _ = induction_claims(
        SHARED_ROLES, {((0, 2), (0, 3)): 0.9, ((1, 1), (1, 2)): 0.9, PATTERN: 1.5, OTHERS: 0.1}
    )
    assert verdicts[1:3] == ["not reproduced", "not reproduced"]


def test_induction_claims_without_pattern_heads_are_not_reproduced():
    """No layer-0 head over the previous-token bar and no layer-1 head over the induction bar: claims 2 and 3 fail
    whatever the heads cost alone, and heads over 1 nat singled out by no pattern leave claim 5 not reproduced."""
    rows = [(0, 0, 0.09, 0.02, 3.0), (0, 1, 0.02, 0.02, 0.1), (1, 0, 0.02, 0.25, 2.0), (1, 1, 0.02, 0.03, 0.1)]
    others = tuple((layer, head) for layer, head, *_ in rows)
    verdicts, numbers = induction_claims(rows, {(): 0.0, others: 5.0})
    assert verdicts[1:3] == ["not reproduced", "not reproduced"] and verdicts[4] == "not reproduced"
    assert numbers["prev_token_heads"] == [] and numbers["induction_heads"] == []


def test_induction_claim_5_compares_against_every_pattern_head_of_both_layers():
    """A head over 1 nat that is a previous-token head but not layer 0's top scorer counts as singled out by the
    patterns (the rule that added only the top layer-0 head said partly); a head over 1 nat with no pattern (seed
    3's L0H0 on this project's AMD EPYC) leaves the claim partly."""
    rows = [(0, 0, 0.03, 0.06, 0.09), (0, 1, 0.30, 0.05, 0.50), (0, 2, 0.20, 0.04, 2.00), (0, 3, 0.03, 0.04, 0.05)]
    rows += [(1, 0, 0.03, 0.70, 3.00), (1, 1, 0.03, 0.05, 0.01), (1, 2, 0.03, 0.05, 0.02), (1, 3, 0.03, 0.05, 0.01)]
    pattern, others = ((0, 1), (0, 2), (1, 0)), ((0, 0), (0, 3), (1, 1), (1, 2), (1, 3))
    joint = {((0, 1), (0, 2)): 5.0, ((1, 0),): 3.0, pattern: 8.0, others: 0.2}
    verdicts, numbers = induction_claims(rows, joint)
    assert numbers["critical_heads"] == ["L0H2", "L1H0"] and verdicts[4] == "reproduced"
    rows[0] = (0, 0, 0.03, 0.06, 3.08)
    verdicts, numbers = induction_claims(rows, joint)
    assert numbers["critical_heads_singled_out_by_patterns"] == 2 and verdicts[4] == "partly"


@pytest.mark.slow  # 241 s on this project's 2 cores beside other jobs (one thread); the finding's verdicts are checked
# on made-up tables above, and every experiment runs end to end at smoke size in the default suite (test_experiments.py)
def test_reduced_induction_heads_finding(monkeypatch, tmp_path):
    """`headcount-train experiment=induction_heads` cut to 2500 steps: the model copies in context; zeroing layer 0's
    previous-token heads (by pattern) together costs more than 1 nat on the repeated part, and so does zeroing layer
    1's induction heads (by pattern); the files agree with the scans they were computed from."""
    args = ["experiment=induction_heads", "trainer.max_steps=2500", f"hydra.run.dir={tmp_path}"]
    quiet = ["trainer.progress_bar=false", "ablation.progress=false"]
    assert train_in_process(monkeypatch, tmp_path, [*args, *quiet]) == 0
    finding = json.loads((tmp_path / "findings" / "findings.json").read_text())
    numbers = finding["numbers"]
    assert numbers["repeated_part_loss"] < 0.25 * numbers["context_free_guess_loss"]
    assert numbers["prev_token_heads_joint_delta"] > 1.0
    assert numbers["top_induction_head_score"] > 0.5
    assert numbers["induction_heads_joint_delta"] > 1.0
    single = pd.read_csv(RunPaths(tmp_path).ablation / "single_head.csv")
    assert numbers["critical_heads"] == [f"L{r.layer}H{r.head}" for r in single.itertuples() if r.delta_loss > 1.0]
    assert [c["verdict"] for c in finding["claims"]][:2] == ["reproduced", "reproduced"]
    assert all(c["verdict"] in VERDICTS for c in finding["claims"])
    assert (tmp_path / "findings" / "induction_heads.png").stat().st_size > 0


def quickstart_verdicts(run_dir: Path, seed: int, threads: int) -> list[str]:
    """`headcount-train experiment=induction_heads seed=<seed>` at <threads> OpenMP threads; its claims' verdicts."""
    args = ["experiment=induction_heads", "trainer.progress_bar=false", "ablation.progress=false", f"seed={seed}"]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "OMP_WAIT_POLICY": "PASSIVE"}  # no busy-waiting threads
    command = [sys.executable, str(REPO / "scripts" / "train.py"), *args, f"hydra.run.dir={run_dir}"]
    proc = subprocess.run(command, cwd=run_dir.parent, capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((run_dir / "metrics.json").read_text())["cpu_threads"] == threads
    return verdicts(run_dir)


class VerdictsDiffer(Exception):
    """Two runs' verdicts, which should be the same, differ."""


# Issue 29: another CPU kind rounds differently, so the quickstart trains to other numbers there; another thread count
# is the perturbation closest to it on one machine. On this project's 2-core AMD EPYC (torch 2.13.0 CPU) seed 0's
# verdicts differed between one thread and two (R/R/R/R/R against R/N/R/R/R) while claims 2 and 3 were about the top
# head alone: at two threads L0H2 and L0H3 share the previous-token role, neither over a nat alone. Each role's pattern
# heads zeroed together give six reproduced claims at both (docs/REPRODUCTIONS.md).
@pytest.mark.slow  # 665 s on this project's 2 cores beside other jobs: two quickstart runs of 4000 steps
def test_quickstart_verdict_is_the_same_at_one_and_two_threads(tmp_path):
    """`headcount-train experiment=induction_heads` (seed 0) at one thread and at two: every claim reproduced at
    both."""
    claims = {threads: quickstart_verdicts(tmp_path / f"threads{threads}", 0, threads) for threads in (1, 2)}
    assert claims[1] == claims[2] == ["reproduced"] * 6, claims


# Seed 3 (at one thread and at two, on this project's AMD EPYC and on an Intel Xeon alike) also leans on a layer-0 head
# with no previous-token pattern (L0H0 at one thread here: attends to its own token, +3.08 nats alone), so claims 4
# and 5 are not reproduced and partly there, and reproduced for seeds 0, 1, 2 and 4: the verdict depends on the seed,
# not on the CPU kind or the thread count (docs/REPRODUCTIONS.md). Strict: once a setup makes them agree, this fails
# until the marker goes; a run that fails is a failure, not the expected one.
@pytest.mark.xfail(
    strict=True,
    raises=VerdictsDiffer,
    reason="seed 3 leans on a head with no pattern: claims 4 and 5 fail or partly there",
)
@pytest.mark.slow  # 502 s on this project's 2 cores beside other jobs: two quickstart runs at one thread
def test_quickstart_verdict_is_the_same_for_every_seed(tmp_path):
    """`headcount-train experiment=induction_heads seed=N` for seeds 0 and 3 at one thread: every claim's verdict
    must be the same for both."""
    claims = {seed: quickstart_verdicts(tmp_path / f"seed{seed}", seed, 1) for seed in (0, 3)}
    if claims[0] != claims[3]:
        raise VerdictsDiffer(claims)


@pytest.mark.slow  # 100 s; each experiment runs at smoke size in the default suite (test_experiments.py)
def test_every_experiment_from_the_command_line_at_smoke_size(tmp_path):
    """`headcount-train -m experiment=glob(*) size=smoke`: each experiment a single smoke job; the ones whose
    finding reads one run check it."""
    args = ["-m", "experiment=glob(*)", "size=smoke"]
    args.append(f"hydra.sweep.dir={tmp_path}/${{experiment}}")  # as the default folder does: one per experiment
    run_python([str(REPO / "scripts" / "train.py"), *args], cwd=tmp_path)
    experiments = sorted(p.stem for p in (REPO / "conf" / "experiment").glob("*.yaml"))
    done = sorted(p.parent for p in tmp_path.glob("**/DONE"))
    assert len(done) == len(experiments)
    checked = sorted(p.relative_to(tmp_path).parts[0] for p in tmp_path.glob("**/findings/findings.md"))
    assert checked == ["induction_heads", "nmt_heads", "nmt_roles", "pretrained_heads", "sixteen_heads", "voita_gates"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "experiment, figures",
    [
        ("induction_heads", ["induction_heads.png"]),
        ("sixteen_heads", ["sixteen_heads.png", "pruning.png"]),
        ("voita_gates", ["voita_gates.png"]),
        ("head_count", ["head_count.png"]),
        ("concat_vs_sum", ["concat_vs_sum.png"]),
    ],
)
def test_experiment_as_documented(tmp_path, experiment, figures):
    """The command docs/REPRODUCTIONS.md gives, into a fresh folder: its finding files, figures and verdicts."""
    where = "hydra.sweep.dir" if experiment in ("head_count", "concat_vs_sum") else "hydra.run.dir"
    args = [f"experiment={experiment}", "trainer.progress_bar=false", "ablation.progress=false", f"{where}={tmp_path}"]
    run_python([str(REPO / "scripts" / "train.py"), *args], cwd=tmp_path)
    finding = json.loads((tmp_path / "findings" / "findings.json").read_text())
    assert finding["experiment"] == experiment and finding["claims"]
    assert all(c["verdict"] in VERDICTS for c in finding["claims"])
    assert sorted(finding["figures"]) == sorted(figures)
    assert all((tmp_path / "findings" / name).stat().st_size > 0 for name in figures)
    assert (tmp_path / "findings" / "findings.md").read_text().startswith(f"# {experiment}: ")


def test_induction_claim_5_is_only_reproduced_when_the_single_head_ranking_is_stable():
    """The claim of which heads the ablation singles out rests on the single-head ranking: a planted unstable top (its
    resamples' top holding 40% of it on average) lowers "reproduced" to "partly" and says so; a stable one keeps it."""
    from headcount.findings.induction import claims_of

    joint = {((0, 2), (0, 3)): 6.42, ((1, 1), (1, 2)): 7.75, PATTERN: 7.24, OTHERS: 0.15}
    entry = {"top_n": 1, "resamples": 1000, "mean_overlap": 0.99, "min_overlap": 0.0}
    together = lambda heads: joint[tuple(sorted(heads))]  # noqa: E731
    stable, numbers = claims_of(induction_heads_table(SHARED_ROLES), together, 0.01, 12.0, 4.1, entry)
    assert stable[4].verdict == "reproduced" and numbers["single_head_top_bootstrap_overlap"] == 0.99
    assert "hold on average 99% of their places (lowest 0%) over 1000 bootstrap resamples" in stable[4].measured
    unstable, _ = claims_of(
        induction_heads_table(SHARED_ROLES), together, 0.01, 12.0, 4.1, entry | {"mean_overlap": 0.4}
    )
    assert unstable[4].verdict == "partly" and "unstable (under 80%)" in unstable[4].measured
    assert [c.verdict for c in unstable[:4]] == [c.verdict for c in stable[:4]]  # only the ranking's claim moves
    none, _ = claims_of(induction_heads_table(SHARED_ROLES), together, 0.01, 12.0, 4.1, "not computed: resumed")
    assert (
        none[4].verdict == "reproduced" and "ranking stability not measured (not computed: resumed)" in none[4].measured
    )
