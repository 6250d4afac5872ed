"""The uncertainty a finding's verdict takes into account where it says "a few heads" or "the circuit": a claim that
rests on a head ranking is only "reproduced" when the ranking's top is stable over bootstrap resamples of the prompts
(the scan's summary `intervals` entry: ablation/scans/intervals.py), and a claim that one mask beats others only when
their bootstrap intervals do not overlap. Otherwise the verdict is lowered to "partly" and the text says why.
"""

import math

import pandas as pd

from headcount.findings.claims import Claim

STABLE = 0.8  # the ranking's top is stable: on average its resamples' top n hold at least 80% of the full data's


def ranking_stability(claim: Claim, entry: dict | str | None, ranking: str, key: str) -> tuple[Claim, dict]:
    """The claim with its ranking's stability said beside its verdict, and "reproduced" lowered to "partly" where the
    top is unstable (mean overlap under STABLE). entry: {top_n, resamples, mean_overlap, min_overlap}, as a scan's
    summary `intervals` entry (a string says why there is none; None: the run has none): then only said, the verdict
    unchanged. ranking: what is ranked, in words ("single_head by damage"); key: the numbers' name for the overlap."""
    if not isinstance(entry, dict):
        why = entry or "no bootstrap intervals in the run"
        return Claim(claim.claim, f"{claim.measured}; ranking stability not measured ({why})", claim.verdict), {}
    mean, low = entry["mean_overlap"], entry["min_overlap"]
    measured = (
        f"{claim.measured}; the top {entry['top_n']} of {ranking} hold on average {share(mean)} of their places "
        f"(lowest {low:.0%}) over {entry['resamples']} bootstrap resamples"
    )
    verdict = claim.verdict
    if mean < STABLE:
        measured += f": unstable (under {STABLE:.0%})"
        if verdict == "reproduced":
            verdict = "partly"
            measured += ", so the ranking's claim holds only partly"
    return Claim(claim.claim, measured, verdict), {key: mean}


def share(mean: float) -> str:
    """The mean overlap in whole percent, or to a tenth where whole percent would round it onto the other side of
    STABLE (0.795 is "79.5%", not an "80%" called unstable)."""
    whole = f"{mean:.0%}"
    return f"{mean:.1%}" if (round(mean, 2) >= STABLE) != (mean >= STABLE) else whole


def separated(table: pd.DataFrame, best: pd.Series, others: pd.DataFrame, value: str) -> bool | None:
    """Whether `best`'s bootstrap interval of `value` (a column with _ci_low/_ci_high beside it, larger is better)
    lies wholly above every row of `others`'; None where the table has no intervals."""
    low, high = f"{value}_ci_low", f"{value}_ci_high"
    if low not in table or not len(others) or math.isnan(float(best[low])):
        return None
    return bool(float(best[low]) > float(others[high].max()))
