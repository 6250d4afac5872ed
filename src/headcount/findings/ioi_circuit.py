"""The IOI circuit on a real model (experiment ioi_circuit: SmolLM2-135M or Gemma-3-270M, task=ioi, patch mode, the
logit difference between the indirect object and the subject), after Wang et al. 2022, "Interpretability in the
wild". Its scans find three classes of heads, each from the one before, and the claims check each class as the paper
does, by where it attends:

(1) the model does the task: logit difference above 2 nats and top-1 accuracy above 90%;
(2) name movers, the heads of largest direct effect, attend from the end to IO more than to S (both mentions);
(3) S-inhibition heads, the heads whose paths into the name movers' queries do most damage, attend from the end to
    S2 more than to IO;
(4) induction and duplicate-token heads, the heads whose paths into the S-inhibition heads' values do most damage,
    attend from S2 to S1+1 (induction) or to S1 (duplicate token) more than to IO;
(5) the circuit is faithful: its heads kept with every other head patched keep at least 80% of the clean logit
    difference (faithfulness, relative to every head patched), more than every random circuit of as many heads.

A class passes when all its heads attend as the paper says (reproduced), at least half of them (partly); (3) and (4)
are only reproduced where their path-patching ranking's top 3 is stable over bootstrap resamples of the prompts
(the scan's `intervals` entry; findings/stability.py). Each claim's verdict is a function of plain tables (the
*_claim functions), tested on made-up ones.
"""

from pathlib import Path

import pandas as pd

from headcount.ablation.engine.heads import head_name
from headcount.ablation.engine.metrics import table_metric
from headcount.ablation.records.results import read_checked
from headcount.ablation.scans.circuit_inputs import top_sender_heads
from headcount.ablation.scans.head_circuit import circuit_and_random
from headcount.findings.claims import FINDINGS, Claim, Finding, FindingChecker, verdict
from headcount.findings.ioi_heads import PAPER, task_claim
from headcount.findings.run_data import scan_file, scan_results
from headcount.findings.sixteen_heads import copied
from headcount.findings.stability import ranking_stability, separated
from headcount.labels import parse_head, split_heads

CLASS_SIZE = 3  # the experiment's top3 selectors: three heads per class
FAITHFUL = 0.8  # (5) Wang et al. report 87% for their circuit
RANKED = "sender heads by path damage"  # what the classes (3) and (4) take the top of


def check(run_dir: Path, out: Path) -> Finding:
    summary, (direct, s_inhibition, induction, circuit) = scan_results(
        run_dir, ["direct_effect", "s_inhibition", "induction", "circuit"]
    )
    from_end = read_checked(scan_file(run_dir, "position_attention", ".csv", mode_independent=True))
    from_s2 = read_checked(scan_file(run_dir, "attention_from_s2", ".csv", mode_independent=True))
    stable = lambda scan: summary.get("intervals", {}).get(scan)  # noqa: E731  path patching's top-n stability
    effects = direct.assign(name=[head_name(r.layer, r.head) for r in direct.itertuples()]).set_index("name")
    name_movers = effects["direct_effect"].nlargest(CLASS_SIZE).index.tolist()  # as top3:direct_effect ranks them
    results = [
        task_claim(summary["baseline_logit_diff"], summary["task_top1"]),
        name_movers_claim(name_movers, effects["direct_effect"], from_end),
        s_inhibition_claim(
            top_sender_heads(s_inhibition, CLASS_SIZE), path_effects(s_inhibition), from_end, stable("s_inhibition")
        ),
        induction_claim(top_sender_heads(induction, CLASS_SIZE), path_effects(induction), from_s2, stable("induction")),
        faithfulness_claim(circuit),
    ]
    numbers = {"baseline_logit_diff": summary["baseline_logit_diff"], "task_top1": summary["task_top1"]}
    for _, claim_numbers in results:
        numbers.update(claim_numbers)
    scans = ["direct_effect", "s_inhibition", "induction", "circuit"]
    cited = [scan_file(run_dir, scan, ".png") for scan in scans]
    cited += [scan_file(run_dir, f"{scan}_circuit", ".png") for scan in ("s_inhibition", "induction")]
    return Finding("ioi_circuit", PAPER, [claim for claim, _ in results], numbers, copied(cited, out))


def path_effects(paths: pd.DataFrame) -> pd.Series:
    """Each sender's path effect, added up over its rows (metric(patched) - metric(clean))."""
    return paths.groupby("sender", sort=False)["effect"].sum()


def attention_of(attention: pd.DataFrame, head: str) -> pd.Series:
    layer, h = parse_head(head)
    return attention[(attention["layer"] == layer) & (attention["head"] == h)].iloc[0]


def class_verdict(passes: list[bool]) -> str:
    return verdict(bool(passes) and all(passes), bool(passes) and sum(passes) >= len(passes) / 2)


def name_movers_claim(heads: list[str], direct: pd.Series, from_end: pd.DataFrame) -> tuple[Claim, dict]:
    rows = [attention_of(from_end, h) for h in heads]
    to_s = [r["attn_to_S1"] + r["attn_to_S2"] for r in rows]
    passes = [bool(r["attn_to_IO"] > s) for r, s in zip(rows, to_s)]
    measured = "; ".join(
        f"{h} (direct effect {direct[h]:+.2f}): IO {r['attn_to_IO']:.2f} vs S {s:.2f}"
        for h, r, s in zip(heads, rows, to_s)
    )
    claim = Claim(
        "(2) Name movers (largest direct effect) attend from the end to IO more than to S (S1 + S2)",
        measured or "no name-mover candidates",
        class_verdict(passes),
    )
    return claim, {"name_movers": heads, "name_movers_attend_io": sum(passes)}


def s_inhibition_claim(
    heads: list[str], effects: pd.Series, from_end: pd.DataFrame, stability: dict | str | None = None
) -> tuple[Claim, dict]:
    """stability: the s_inhibition scan's `intervals` entry; the class is only reproduced where its ranking's top is
    stable over resamples of the prompts (findings/stability.py)."""
    rows = [attention_of(from_end, h) for h in heads]
    passes = [bool(r["attn_to_S2"] > r["attn_to_IO"]) for r in rows]
    measured = "; ".join(
        f"{h} (path effect {effects[h]:+.2f}): S2 {r['attn_to_S2']:.2f} vs IO {r['attn_to_IO']:.2f}"
        for h, r in zip(heads, rows)
    )
    claim = Claim(
        "(3) S-inhibition heads (largest damage through the name movers' queries) attend from the end to S2 more "
        "than to IO",
        measured or "no S-inhibition candidates",
        class_verdict(passes),
    )
    claim, stable = ranking_stability(
        claim, class_stability(stability, heads), RANKED, "s_inhibition_bootstrap_overlap"
    )
    return claim, {"s_inhibition": heads, "s_inhibition_attend_s2": sum(passes)} | stable


def induction_claim(
    heads: list[str], effects: pd.Series, from_s2: pd.DataFrame, stability: dict | str | None = None
) -> tuple[Claim, dict]:
    """stability: the induction scan's `intervals` entry, as s_inhibition_claim's."""
    rows = [attention_of(from_s2, h) for h in heads]
    kinds = [
        "induction" if r["attn_to_S1+1"] >= r["attn_to_S1"] else "duplicate token" for r in rows
    ]  # the larger of the two says which the head is
    passes = [bool(max(r["attn_to_S1+1"], r["attn_to_S1"]) > r["attn_to_IO"]) for r in rows]
    measured = "; ".join(
        f"{h} (path effect {effects[h]:+.2f}): S1+1 {r['attn_to_S1+1']:.2f}, S1 {r['attn_to_S1']:.2f} vs IO "
        f"{r['attn_to_IO']:.2f} ({kind if ok else 'neither'})"
        for h, r, kind, ok in zip(heads, rows, kinds, passes)
    )
    claim = Claim(
        "(4) Induction / duplicate-token heads (largest damage through the S-inhibition heads' values) attend from S2 "
        "to S1+1 (induction) or S1 (duplicate token) more than to IO",
        measured or "no induction candidates",
        class_verdict(passes),
    )
    claim, stable = ranking_stability(claim, class_stability(stability, heads), RANKED, "induction_bootstrap_overlap")
    return claim, {"induction": heads, "induction_attend_s1": sum(passes)} | stable


def class_stability(entry: dict | str | None, heads: list[str]) -> dict | str | None:
    """The scan's stability entry where it ranks exactly this class (its top n are these heads); else why not."""
    if isinstance(entry, dict) and entry.get("heads") != heads:
        return f"the scan's top {entry['top_n']} ({', '.join(entry['heads'])}) are not this class"
    return entry


def faithfulness_claim(circuit: pd.DataFrame) -> tuple[Claim, dict]:
    """(5) from the circuit scan's table; where it has bootstrap intervals (delta_<metric>_ci_low/_high), beating the
    random circuits counts as reproduced only when the circuit's interval lies above all of theirs."""
    row, random = circuit_and_random(circuit)
    value, heads = float(row["faithfulness"]), split_heads(row["kept"])
    random_max = float(random["faithfulness"].max()) if len(random) else float("nan")
    beats = bool(len(random)) and value > random_max
    apart = separated(circuit, row, random, f"delta_{table_metric(circuit).primary}") if beats else None
    holds = [value >= FAITHFUL, beats and apart is not False]
    measured = (
        f"the {len(heads)} heads ({', '.join(heads)}) kept, every other head patched: faithfulness {value:.0%}; "
        + (
            f"{len(random)} random circuits of {len(heads)} heads: {float(random['faithfulness'].min()):.0%} to "
            f"{random_max:.0%}"
            if len(random)
            else "no random circuits"
        )
    )
    if apart is not None:
        measured += (
            "; its bootstrap interval lies above every random circuit's"
            if apart
            else "; but its bootstrap interval overlaps a random circuit's, so it does not beat them surely"
        )
    claim = Claim(
        f"(5) The circuit is faithful: its heads alone keep at least {FAITHFUL:.0%} of the logit difference (every "
        "other head patched), more than random circuits of as many heads",
        measured,
        verdict(all(holds), any(holds) or beats),
    )
    numbers = {"circuit_heads": heads, "circuit_faithfulness": value, "random_faithfulness_max": random_max}
    return claim, numbers | ({} if apart is None else {"circuit_interval_above_random": apart})


FINDINGS.register(
    FindingChecker(
        "ioi_circuit",
        check,
        "run",
        ("direct_effect", "position_attention", "attention_from_s2", "s_inhibition", "induction", "circuit"),
        "Wang et al. 2022: the IOI circuit, name movers, S-inhibition and induction heads, and its faithfulness",
    )
)
