"""run_ablations: every scan the ablation section lists, on one finished run, with results in <run>/ablation/.

A session loads the run's checkpoint and data once, prepares the replacements and the evaluator, then runs the scans
in the order given. Scans that others need (single_head for pairs' top_k and the single_head pruning order, pruning
for a prunable-fraction export) run on demand under their kind's name. Every result carries a fingerprint of what it
depends on (checkpoint bytes, data config, ablation settings, masks): a scan whose CSV is up to date is read back
rather than rerun, an interrupted one resumes from its partial file, and summary.json starts afresh when the
settings change.
"""

import time
from dataclasses import asdict
from pathlib import Path

import pandas as pd
import torch
from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from torch import Tensor

from headcount import plotting as plots
from headcount.ablation.evaluator import MaskEvaluator
from headcount.ablation.examples import split_examples, to_batches
from headcount.ablation.masks import (
    HeadMask,
    all_heads,
    check_head_exists,
    gates_to_masks,
    load_custom_masks,
    masks_to_gates,
    most_important_heads,
)
from headcount.ablation.replacements import Replacements, load_saved, mean_z, resample_sources, save
from headcount.ablation.results import file_digest, fingerprint, read_summary, update_summary, write_csv
from headcount.ablation.scans import evaluate_resumably, scan_masks, scan_table
from headcount.ablation.validation import resolve_device
from headcount.config.ablation import (
    AblationConfig,
    ScanConfig,
    l0_targets,
    validate_ablation_config,
    validate_l0_config,
)
from headcount.config.data import DataConfig
from headcount.errors import ConfigError
from headcount.run_dir import RunPaths, finished_checkpoint, load_model

DATA_KEYS_IGNORED = ("batch_size", "num_workers", "cache_dir")  # they do not change which examples a split holds


def run_ablations(cfg: DictConfig, run_dir: str | Path) -> list[Path]:
    """Run cfg.ablation's scans (and the pruned export, if asked) on the finished run in run_dir; cfg is a train
    config (model, data, seed, ablation). Returns the files written."""
    session = AblationSession(cfg, Path(run_dir))
    for name, scan in session.settings.scans.items():
        session.run_scan(name, scan)
    if session.settings.prune.export:
        session.export()
    return session.written


def typed_ablation(section: DictConfig) -> AblationConfig:
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(AblationConfig), section))


class AblationSession:
    def __init__(self, cfg: DictConfig, run_dir: Path):
        self.settings = s = typed_ablation(cfg.ablation)
        validate_ablation_config(s)
        checkpoint = finished_checkpoint(run_dir)
        self.console = Console(stderr=True)
        self.out = RunPaths(run_dir).ablation
        self.summary_path = self.out / "summary.json"
        self.device = resolve_device(s.device)
        self.model = load_model(checkpoint, map_location="cpu").to(self.device, torch.float32).eval()
        self.heads_per_layer = hpl = self.model.heads_per_layer
        # Everything a file or a head list can get wrong is checked before any work starts.
        self.custom_masks = {
            name: load_custom_masks(scan.masks_file, hpl, f"ablation.scans.{name}.masks_file")
            for name, scan in s.scans.items()
            if scan.kind == "custom"
        }
        for pair in s.prune.heads or []:
            if not (isinstance(pair, list) and len(pair) == 2):
                raise ConfigError("ablation.prune.heads", pair, "each entry must be a [layer, head] pair")
            check_head_exists(*pair, hpl, "ablation.prune.heads")

        from headcount.data import HeadcountDataModule

        data = HeadcountDataModule(OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(DataConfig), cfg.data)))
        data.setup()
        self.splits = data.splits
        examples = split_examples(data.splits, s.split, s.n_eval, "ablation.split")
        data_key = {k: v for k, v in OmegaConf.to_container(cfg.data).items() if k not in DATA_KEYS_IGNORED}
        self.settings_record = {
            "mode": s.mode,
            "split": s.split,
            "n_eval": len(examples["input_ids"]),
            **({} if s.mode == "zero" else {"reference_split": s.reference_split, "n_reference": s.n_reference}),
            **({"mean_per_position": s.mean_per_position} if s.mode == "mean" else {}),
            **({"seed": s.seed} if s.mode == "resample" else {}),
        }
        self.key = fingerprint(file_digest(checkpoint), data_key, self.settings_record)
        self.written: list[Path] = []
        self.replacements = self.prepare_replacements(data.splits, examples)
        self.batches = to_batches(examples, s.batch_size, self.device)
        budget = None if s.memory_budget_mb is None else s.memory_budget_mb * 2**20
        self.evaluator = MaskEvaluator(self.model, self.batches, self.replacements, s.masks_per_pass, budget)
        self.baseline = self.evaluator.baseline()
        self.update_summary(
            {
                "settings": self.settings_record,
                "mode": s.mode,
                "baseline_loss": self.baseline["loss"],
                "baseline_acc": self.baseline["acc"],
                "n_targets": self.baseline["n_targets"],
            }
        )
        self._single_head_delta: Tensor | None = None
        self._prunable: dict[str, float] | None = None

    # --- replacements -------------------------------------------------------------------------------------------

    def prepare_replacements(self, splits: dict, examples: dict[str, Tensor]) -> Replacements:
        """Means or the resample pairing, from ablation/replacements_<mode>.pt when computed under the same settings.
        For resample, adds each eval example's source tokens to `examples` as source_ids."""
        s = self.settings
        if s.mode == "zero":
            return Replacements("zero")
        path = self.out / f"replacements_{s.mode}.pt"
        saved = load_saved(path, self.key)
        reference = None
        if saved is None or s.mode == "resample":
            reference = split_examples(splits, s.reference_split, s.n_reference, "ablation.reference_split")
        if s.mode == "mean":
            if saved is None:
                batches = to_batches(reference, s.batch_size, self.device)
                saved = {"means": [m.cpu() for m in mean_z(self.model, batches, s.mean_per_position)]}
                save(path, self.key, saved)
                self.written.append(path)
            return Replacements("mean", [m.to(self.device) for m in saved["means"]])
        if saved is None:
            same_split = s.split == s.reference_split
            n_eval, n_reference = len(examples["input_ids"]), len(reference["input_ids"])
            saved = {"source_index": resample_sources(n_eval, n_reference, s.seed, same_split)}
            save(path, self.key, saved)
            self.written.append(path)
        examples["source_ids"] = reference["input_ids"][saved["source_index"]]
        return Replacements("resample")

    # --- scans --------------------------------------------------------------------------------------------------

    def run_scan(self, name: str, scan: ScanConfig) -> None:
        if scan.kind == "importance":
            self.importance_scan(name)
        elif scan.kind == "pruning":
            self.pruning_scan(name)
        elif scan.kind == "l0_gates":
            self.l0_gates_scan(name, scan)
        elif scan.kind == "head_scores":
            self.head_scores_scan(name)
        else:
            self.mask_scan(name, scan)

    def masks_and_key(self, name: str, scan: ScanConfig) -> tuple[list[HeadMask], str]:
        """A mask scan's masks and the fingerprint of its results."""
        hpl = self.heads_per_layer
        if scan.kind == "custom":
            masks = self.custom_masks[name]
        else:
            top_heads = None
            if scan.top_k is not None:
                top_heads = lambda: most_important_heads(self.single_head_delta(), hpl, scan.top_k)  # noqa: E731
            masks = scan_masks(scan.kind, hpl, top_heads)
        return masks, fingerprint(self.key, scan.kind, [(m.name, m.heads_off) for m in masks])

    def mask_scan(self, name: str, scan: ScanConfig) -> pd.DataFrame:
        mode = self.settings.mode
        masks, key = self.masks_and_key(name, scan)
        csv_path = self.out / f"{name}.csv"
        table = self.up_to_date(name, key, csv_path)
        if table is None:
            start = time.perf_counter()
            partial = self.out / f"{name}.partial.csv"
            totals = evaluate_resumably(self.evaluator, masks, partial, key, f"{name} ({mode})", self.settings.progress)
            table = scan_table(name, mode, masks, totals, self.baseline)
            write_csv(csv_path, table)
            partial.unlink(missing_ok=True)
            figure = plots.scan_figure(table, scan.kind, self.out / f"{name}.png")
            self.record(name, scan.kind, key, [csv_path, figure], time.perf_counter() - start, len(masks))
        if scan.kind == "single_head":
            self._single_head_delta = self.layer_head_tensor(table, "delta_loss")
            top = table.loc[table["delta_loss"].idxmax()]
            self.update_summary(
                {
                    "most_important_head": {
                        "mask": top["mask"],
                        "layer": int(top["layer"]),
                        "head": int(top["head"]),
                        "delta_loss": float(top["delta_loss"]),
                    }
                }
            )
        return table

    def single_head_delta(self, compute: bool = True) -> Tensor | None:
        """(L, H) loss increase of each head off alone, from this session's single_head scan or an up-to-date
        single_head.csv; failing both, runs the scan, or with compute=False returns None."""
        if self._single_head_delta is None:
            scan = ScanConfig(kind="single_head")
            _, key = self.masks_and_key("single_head", scan)
            if compute or self.up_to_date("single_head", key, self.out / "single_head.csv", announce=False) is not None:
                self.mask_scan("single_head", scan)
        return self._single_head_delta

    def importance_scan(self, name: str) -> None:
        s = self.settings
        key = fingerprint(self.key, "importance", s.normalize_importance)
        csv_path = self.out / f"{name}.csv"
        if self.up_to_date(name, key, csv_path) is not None:
            return
        start = time.perf_counter()
        importance_LH = self.importance(torch.ones(self.model.n_layers, self.model.max_heads)).cpu()
        layers, heads = (list(x) for x in zip(*all_heads(self.heads_per_layer)))
        table = pd.DataFrame({"layer": layers, "head": heads, "grad_importance": importance_LH[layers, heads].numpy()})
        single_head_delta = self.single_head_delta(compute=False)
        if single_head_delta is not None:
            table["single_head_delta"] = single_head_delta[layers, heads].numpy()
        write_csv(csv_path, table)
        title = f"{name}: gradient importance{' (l2 per layer)' if s.normalize_importance else ''}, {s.mode} ablation"
        figure = plots.head_heatmap(table, self.out / f"{name}.png", "grad_importance", title)
        self.record(name, "importance", key, [csv_path, figure], time.perf_counter() - start, len(table))

    def importance(self, mask_LH: Tensor) -> Tensor:
        """Gradient importance at gates mask_LH, on the eval batches, under this session's replacements."""
        from headcount.ablation.importance import gradient_importance

        s = self.settings
        if s.mode != "resample":
            replacements = self.replacements.for_batch(self.model, self.batches[0])
            return gradient_importance(self.model, self.batches, replacements, s.normalize_importance, mask_LH)
        # Resample replacements differ per batch, and gradient_importance takes one set: average per-batch calls
        # (the same E_batches |dL/dg|), then normalise as it would.
        per_batch = []
        for batch in self.batches:
            with torch.no_grad():
                replacements = self.replacements.for_batch(self.model, batch)
            per_batch.append(gradient_importance(self.model, [batch], replacements, False, mask_LH))
        importance_LH = torch.stack(per_batch).mean(dim=0)
        if not s.normalize_importance:
            return importance_LH
        return importance_LH / importance_LH.norm(dim=1, keepdim=True).clamp_min(torch.finfo(importance_LH.dtype).tiny)

    def pruning_scan(self, name: str) -> dict[str, float]:
        from headcount.ablation.pruning import prunable_fractions, pruning_curves

        s, p = self.settings, self.settings.pruning
        key = fingerprint(self.key, "pruning", asdict(p), s.normalize_importance, s.seed)
        csv_path = self.out / f"{name}.csv"
        curves = self.up_to_date(name, key, csv_path)
        if curves is None:
            start = time.perf_counter()
            partial = self.out / f"{name}.partial.csv"

            def evaluate(gates_MLH: Tensor) -> dict[str, Tensor]:
                masks = gates_to_masks(gates_MLH, self.heads_per_layer)
                totals = evaluate_resumably(self.evaluator, masks, partial, key, f"{name} ({s.mode})", s.progress)
                return {"loss": totals.loss(), "acc": totals.acc()}

            delta = self.single_head_delta() if "single_head" in p.orders else None
            curves = pruning_curves(evaluate, self.importance, delta, self.heads_per_layer, p, s.seed, self.baseline)
            write_csv(csv_path, curves)
            partial.unlink(missing_ok=True)
            title = f"{name}: {s.mode} ablation, loss vs heads pruned"
            figure = plots.pruning_figure(curves, self.out / f"{name}.png", self.baseline["loss"], p.tolerance, title)
            self.record(name, "pruning", key, [csv_path, figure], time.perf_counter() - start, len(curves))
        self._prunable = prunable_fractions(curves, self.baseline["loss"], p.tolerance)
        self.update_summary({"prunable_fraction": self._prunable})
        return self._prunable

    def l0_gates_scan(self, name: str, scan: ScanConfig, announce: bool = True) -> pd.DataFrame:
        """Voita et al.'s learned hard-concrete gates, trained on reference_split, their binary masks evaluated
        exactly on the eval split like every other mask; returns the scan's table."""
        from headcount.ablation.l0_gates import l0_gates_table, train_l0_gates

        s, l0 = self.settings, scan.l0
        validate_l0_config(l0, sum(self.heads_per_layer), f"ablation.scans.{name}.l0")
        key = fingerprint(self.key, "l0_gates", asdict(l0), s.reference_split, s.n_reference)
        csv_path = self.out / f"{name}.csv"
        if (table := self.up_to_date(name, key, csv_path, announce)) is not None:
            return table
        start = time.perf_counter()
        reference = split_examples(self.splits, s.reference_split, s.n_reference, "ablation.reference_split")
        batches = to_batches(reference, s.batch_size, self.device)
        replacements = self.replacements.for_batch(self.model, batches[0]) if s.mode == "mean" else None
        results = [train_l0_gates(self.model, batches, l0, t, replacements, s.progress) for t in l0_targets(l0)]

        table = l0_gates_table(results, lambda gates_MLH: self.evaluator.evaluate(gates_MLH.to(self.device)))
        write_csv(csv_path, table)
        runs = table.drop_duplicates("target_heads" if l0.target_heads is not None else "n_kept")
        self.update_summary(
            {
                "l0_gates": [
                    {"target_heads": r.target_heads, "n_kept": int(r.n_kept), "loss": float(r.loss)}
                    for r in runs.itertuples()
                ]
            }
        )
        kept = table.groupby(["layer", "head"], as_index=False)["kept"].mean().rename(columns={"kept": "kept_share"})
        title = f"{name}: share of L0 runs that keep each head ({len(results)} run(s))"
        figure = plots.head_heatmap(kept, self.out / f"{name}.png", "kept_share", title)
        self.record(name, "l0_gates", key, [csv_path, figure], time.perf_counter() - start, len(table))
        return table

    def head_scores_scan(self, name: str) -> None:
        """Previous-token and induction scores of every head, read off its attention pattern on the eval split."""
        from headcount.ablation.head_scores import head_pattern_scores

        key = fingerprint(self.key, "head_scores")
        csv_path = self.out / f"{name}.csv"
        if self.up_to_date(name, key, csv_path) is not None:
            return
        start = time.perf_counter()
        table = head_pattern_scores(self.model, self.batches)
        write_csv(csv_path, table)
        figures = [
            plots.head_heatmap(table, self.out / f"{name}_{score}.png", score, f"{name}: {score.replace('_', ' ')}")
            for score in ("prev_token_score", "induction_score")
        ]
        self.record(name, "head_scores", key, [csv_path, *figures], time.perf_counter() - start, len(table))

    # --- structural export --------------------------------------------------------------------------------------

    def export(self) -> None:
        from headcount.ablation.export import export_pruned, removal_gates

        s, prune = self.settings, self.settings.prune
        if prune.heads is not None:
            chosen = HeadMask("ablation.prune.heads", tuple(tuple(pair) for pair in prune.heads))
            keep_LH = masks_to_gates([chosen], self.heads_per_layer)[0]
            meta = {"chosen_by": "ablation.prune.heads"}
        elif prune.order == "l0_gates":
            keep_LH = self.l0_gates_keep(prune.l0_target_heads)
            meta = {"chosen_by": "l0_gates", "order": "l0_gates", "target_heads": prune.l0_target_heads}
        else:
            fraction = prune.fraction if prune.fraction is not None else self.prunable_fraction(prune.order)
            keep_LH = removal_gates(
                prune.order, fraction, self.heads_per_layer, s.pruning, s.seed, self.importance, self.single_head_delta
            )
            meta = {"chosen_by": f"pruning order {prune.order}", "order": prune.order, "fraction": fraction}
        path = self.out / "pruned.ckpt"
        means = self.replacements.means if s.mode == "mean" else None
        speed_shape = (s.batch_size, self.batches[0]["input_ids"].shape[1])
        record = export_pruned(self.model, self.evaluator, keep_LH, means, path, {**meta, "mode": s.mode}, speed_shape)
        self.written.append(path)
        self.update_summary({"pruned": record})

    def l0_gates_keep(self, target_heads: int | None) -> Tensor:
        """(L, H) keep-gates of the binary mask the l0_gates scan learned for target_heads (its only run if None)."""
        name, scan = next((name, scan) for name, scan in self.settings.scans.items() if scan.kind == "l0_gates")
        table = self.l0_gates_scan(name, scan, announce=False)  # computed by the scan itself just before
        if target_heads is not None:
            table = table[table["target_heads"] == target_heads]
        return self.layer_head_tensor(table, "kept").float()

    def prunable_fraction(self, order: str) -> float:
        if self._prunable is None:
            self.pruning_scan("pruning")
        if order not in self._prunable:
            raise ConfigError(
                "ablation.prune.order",
                order,
                f"has no pruning curve: add it to ablation.pruning.orders ({', '.join(self._prunable)}) "
                "or set ablation.prune.fraction",
            )
        return self._prunable[order]

    # --- bookkeeping --------------------------------------------------------------------------------------------

    def up_to_date(self, name: str, key: str, csv_path: Path, announce: bool = True) -> pd.DataFrame | None:
        """The scan's table if summary.json says it was computed under this fingerprint and its CSV is there."""
        entry = read_summary(self.summary_path, self.key).get("scans", {}).get(name, {})
        if entry.get("fingerprint") != key or not csv_path.exists():
            return None
        if announce:
            self.console.print(f"[green]up to date:[/green] {csv_path}", highlight=False)
        return pd.read_csv(csv_path, keep_default_na=False, dtype={"mask": str})

    def record(self, name: str, kind: str, key: str, files: list[Path | None], seconds: float, rows: int) -> None:
        files = [f for f in files if f is not None]
        self.written.extend(files)
        entry = {"kind": kind, "fingerprint": key, "files": [f.name for f in files], "rows": rows, "seconds": seconds}
        self.update_summary({"scans": {name: entry}})

    def update_summary(self, updates: dict) -> None:
        update_summary(self.summary_path, self.key, updates)
        if self.summary_path not in self.written:
            self.written.append(self.summary_path)

    def layer_head_tensor(self, table: pd.DataFrame, column: str) -> Tensor:
        values_LH = torch.zeros(self.model.n_layers, self.model.max_heads, dtype=torch.float64)
        values_LH[table["layer"].tolist(), table["head"].tolist()] = torch.tensor(table[column].tolist()).double()
        return values_LH
