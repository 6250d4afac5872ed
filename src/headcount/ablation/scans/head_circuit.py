"""`head_circuit`: how much of the behaviour a set of heads carries alone. The circuit's heads (`heads`: head names,
a layer's heads `L3`, another scan kind's top k `top3:direct_effect`, or a path_patching scan's top k sender heads
by its name `top3:s_inhibition`) are kept and every other head is ablated by the session's mode (patch: its output
on the corrupted prompt), beside `random_sets` circuits of as many heads drawn at random (seeded by ablation.seed)
and the model with every head ablated. Embeddings and MLPs are kept, as Wang et al. 2022 keep them.

Faithfulness = (M(circuit kept) - M(no head kept)) / (M(clean) - M(no head kept)): 1 when the circuit does what the
whole model does, 0 when it does what no head does. In edge terms it is the circuit of every edge between the
embeddings, the MLPs, the logits and the circuit's heads (removing all of a head's out-edges is ablating its z), but
evaluated as head masks on the fast evaluator. One row per mask (a mask scan: the metric, its delta, gap_fraction),
plus `kept` (the heads kept), `faithfulness` and its 95% bootstrap interval over the prompts (faithfulness_ci_low,
_ci_high: intervals.py's resamples, numerator and denominator from the same one); summary.json's `head_circuit` entry
has the circuit's faithfulness and interval beside the random circuits' faithfulness. The figure draws every mask's
faithfulness with its interval.

On an encoder-decoder (its heads one grid of three kinds, labels.KindRows) the heads are named by kind (enc.L0H1,
cross.L1H0, a kind's layer cross.L1, every head `heads`, or a ranking scan's top k `top3:direct_effect`, by its grid
scores), the masks go through its evaluator as every mask scan's do (a sequence-to-sequence task's patch, or any
mode that needs no task at the teacher-forced targets), `kept` names the heads by kind and kept_enc, kept_dec,
kept_cross count them.
"""

from pathlib import Path

import pandas as pd
import torch

from headcount.ablation.engine.heads import Head, all_heads, top_heads
from headcount.ablation.engine.masks import HeadMask, grid_head, joined_name
from headcount.ablation.scans.base import KINDS, ScanResult
from headcount.ablation.scans.circuit_inputs import TOP, check_top_names, named_heads, ranked_scans
from headcount.ablation.scans.custom import CustomScan
from headcount.ablation.scans.intervals import ExampleSums, interval_figure
from headcount.ablation.scans.mask_scan import MaskScan
from headcount.circuits import Graph
from headcount.config.ablation import AblationConfig
from headcount.config.scans import HeadCircuitSettings
from headcount.errors import ConfigError
from headcount.labels import HEADS_SEPARATOR, MASK_SEPARATOR, KindRows, grid_head_label, split_heads

CIRCUIT, NONE_KEPT = "circuit", "no head kept"


@KINDS.register
class HeadCircuitScan(MaskScan):
    kind = "head_circuit"
    doc = "a circuit's heads kept, every other head ablated: faithfulness beside random circuits of as many heads"
    reads = MaskScan.reads | {"model"}
    Settings = HeadCircuitSettings

    @classmethod
    def check(cls, name: str, cfg: HeadCircuitSettings, settings: AblationConfig) -> None:
        key = f"ablation.scans.{name}"
        if not cfg.heads:
            raise ConfigError(f"{key}.heads", [], "names none: list the circuit's heads")
        if cfg.random_sets < 0:
            raise ConfigError(f"{key}.random_sets", cfg.random_sets, "must be 0 or more")
        check_top_names(name, cfg.heads, settings, f"{key}.heads")

    def needs(self) -> list[str]:
        return ranked_scans(self.cfg.heads)  # a top-k entry's ranking (top3:direct_effect), run before this one

    def prepare(self) -> None:
        if not any(str(e).strip().startswith("top") for e in self.cfg.heads):
            self.kept()  # every name checked against the model before any work (top-k names need their scan)

    def kept(self) -> tuple[Head, ...]:
        """The circuit's heads, (layer, head), in the model's order (an encoder-decoder's: (grid row, head))."""
        key, grid = f"ablation.scans.{self.name}.heads", self.session.model.heads_per_layer
        if isinstance(grid, KindRows):
            return tuple(
                sorted({h for entry in self.cfg.heads for h in grid_heads(str(entry), grid, self.session, key)})
            )
        graph = Graph.of(self.session.model)
        heads = set()
        for entry in self.cfg.heads:
            for name in named_heads(str(entry), self.session, key) or [str(entry).strip()]:
                node = graph.node(name, key)
                if node.kind != "head":
                    raise ConfigError(key, name, "is not a head: a head circuit keeps heads (L3H1, L3, top3:...)")
                heads.add((node.layer, node.head))
        return tuple(sorted(heads))

    def masks(self) -> list[HeadMask]:
        session, hpl = self.session, self.session.model.heads_per_layer
        everything, kept = all_heads(hpl), self.kept()
        off = lambda keep: tuple(h for h in everything if h not in set(keep))  # noqa: E731
        masks = [HeadMask(f"{CIRCUIT}: {joined_name(kept, hpl)}", off(kept)), HeadMask(NONE_KEPT, tuple(everything))]
        for s in range(self.cfg.random_sets):
            pick = torch.randperm(len(everything), generator=torch.Generator().manual_seed(session.settings.seed + s))
            chosen = tuple(sorted(everything[i] for i in pick[: len(kept)].tolist()))
            name = f"random {len(kept)} (seed {session.settings.seed + s}): {joined_name(chosen, hpl)}"
            masks.append(HeadMask(name, off(chosen)))
        return masks

    def compute(self, key: str) -> ScanResult:
        result = super().compute(key)
        table = result.table
        hpl = self.session.model.heads_per_layer
        everything = all_heads(hpl)
        kept = [[h for h in everything if h not in set(m.heads_off)] for m in self.head_masks]
        table["kept"] = [HEADS_SEPARATOR.join(grid_head_label(hpl, *h) for h in k) for k in kept]
        if isinstance(hpl, KindRows):  # how many heads of each kind a circuit keeps
            for kind in hpl.kinds():
                table[f"kept_{kind}"] = [sum(hpl.rows[row][0] == kind for row, _ in k) for k in kept]
        primary = self.session.metric.primary
        result.table = with_faithfulness(table, self.session.baseline[primary], primary, self.example_sums)
        return result

    def use(self, table: pd.DataFrame) -> None:
        circuit, random = circuit_and_random(table)
        entry = {
            "heads": split_heads(circuit["kept"]),
            "faithfulness": float(circuit["faithfulness"]),
            "faithfulness_interval": [float(circuit["faithfulness_ci_low"]), float(circuit["faithfulness_ci_high"])],
            "random_faithfulness": [float(v) for v in random["faithfulness"]],
        }
        self.session.files.update_summary({"head_circuit": {self.name: entry}})

    @classmethod
    def figure(cls, table: pd.DataFrame, path: Path, subject: str = "") -> Path:
        return CustomScan.figure(table, path, subject)

    def file_names(self) -> list[tuple[str, str]]:
        return [*super().file_names(), ("_faithfulness", ".png")]

    def figures(self, table: pd.DataFrame) -> list[Path | None]:
        figures = super().figures(table)
        if table["faithfulness_ci_low"].notna().any():
            title = self.title("faithfulness of the circuit, random circuits and no head kept")
            path = self.path(".png", "_faithfulness")
            figures.append(interval_figure(table, path, title, "faithfulness", "faithfulness", len(table)))
        return figures


def grid_heads(entry: str, grid: KindRows, session, key: str) -> list[Head]:
    """The (grid row, head) pairs one entry names on an encoder-decoder: a head by kind (cross.L1H0), a kind's layer
    (cross.L1), every head (heads) or a ranking scan's top k (top3:direct_effect, by its grid of scores)."""
    text = entry.strip()
    if text == "heads":
        return all_heads(grid)
    layers = {grid.layer_label(row): row for row in range(len(grid))}
    if text in layers:
        return [(layers[text], h) for h in range(grid[layers[text]])]
    if top := TOP.match(text):
        if top[3]:
            raise ConfigError(key, entry, f"names heads' .{top[3]} inputs: a head circuit keeps heads; drop the suffix")
        if int(top[1]) > len(all_heads(grid)):
            raise ConfigError(key, entry, f"k must be at most the model's {len(all_heads(grid))} heads")
        return top_heads(session.provided(top[2]), grid, int(top[1]))
    if MASK_SEPARATOR in text:
        raise ConfigError(key, entry, "names several heads: list each head of the circuit apart")
    return [grid_head(text, grid, key)]


def with_faithfulness(table: pd.DataFrame, clean: float, metric: str, sums: ExampleSums | None = None) -> pd.DataFrame:
    """The table with each mask's faithfulness, (M(mask) - M(no head kept)) / (M(clean) - M(no head kept)), and its
    bootstrap interval over the prompts where their sums are given (NaN where not kept): numerator and denominator
    from the same resample, the none-kept and clean sums drawn with the mask's."""
    none_row = int((table["mask"] == NONE_KEPT).to_numpy().nonzero()[0][0])
    none_kept = float(table[metric].iloc[none_row])
    gap = clean - none_kept
    table["faithfulness"] = (table[metric] - none_kept) / gap if gap != 0 else float("nan")
    if sums is None:
        return table.assign(faithfulness_ci_low=float("nan"), faithfulness_ci_high=float("nan"))
    none_E = sums.masks_ME[none_row]
    low, high = sums.share_interval(sums.masks_ME - none_E[None], sums.baseline_E - none_E, sums.points_E)
    return table.assign(faithfulness_ci_low=low.numpy(), faithfulness_ci_high=high.numpy())


def circuit_and_random(table: pd.DataFrame) -> tuple[pd.Series, pd.DataFrame]:
    """A head_circuit table's circuit row and its random circuits' rows."""
    circuit = table[table["mask"].astype(str).str.startswith(f"{CIRCUIT}: ")].iloc[0]
    return circuit, table[table["mask"].astype(str).str.startswith("random ")]
