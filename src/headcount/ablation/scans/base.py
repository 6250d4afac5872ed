"""What every scan kind shares: the registry of kinds, their settings, and the cached-result step.

A scan kind is a `Scan` subclass registered with `@KINDS.register`, beside its typed settings (`Settings`, a
`ScanSettings` dataclass in the same module, holding only the keys that kind reads): it names its fingerprint inputs,
computes its table, draws its figures and says what follows from its table. `Scan.run` does the rest, the same way for
every kind: read the table back when summary.json holds the same fingerprint and the CSV is there (announcing it),
otherwise compute it, append the record columns (mode, metric, splits, sizes), write `<name>.csv`
(`<name>.<section>.csv` for other modes and metrics: single_head.mean.csv, single_head.patch.logit_diff.csv), drop the
partial file a resumable scan kept, draw the figures and record the scan in its section of summary.json. A
`mode_independent` kind (its result is the same in every mode and metric) keeps plain names and one record.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pandas as pd
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, ValidationError

from headcount.ablation.engine.evaluator import MaskTotals
from headcount.ablation.engine.masks import HeadMask
from headcount.ablation.records.distributed import evaluate_resumably
from headcount.ablation.records.results import fingerprint, with_record, write_csv
from headcount.ablation.records.resumable import discard_partials
from headcount.ablation.scans.context import EVERY_SCAN_READS, DeclaredContext, ScanContext
from headcount.config.ablation import AblationConfig
from headcount.config.scans import ScanSettings, not_taken
from headcount.errors import ConfigError, unknown_key
from headcount.processes import first_process
from headcount.registry import Registry

KINDS: Registry[type[Scan]] = Registry(
    "scan kind", "ablation.scans.<name>.kind", "what a scan switches off or reads", named_by="kind"
)


@dataclass
class ScanResult:
    """What a kind's compute returns when its result is more than one table: its table, further tables (by the detail
    their file names carry after the scan's name: `_faithfulness` -> <name>_faithfulness.csv) and its summary.json
    entries. Scan.run writes and records every part, so each is written, hashed and read back like the table."""

    table: pd.DataFrame
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    summary: dict = field(default_factory=dict)


class Scan:
    kind: ClassVar[str]
    doc: ClassVar[str]  # what the kind does, in a line (headcount-ablate --list)
    mode_independent: ClassVar[bool] = False
    ranks_heads: ClassVar[bool] = False  # hands other scans an (L, H) score per head (top_heads ranks by it)
    Settings: ClassVar[type[ScanSettings]] = ScanSettings  # the keys this kind takes (none but its kind here)
    # what the kind reads of the session (ScanContext's names), beyond the cached-result step's: all a scan sees of it
    reads: ClassVar[frozenset[str]] = EVERY_SCAN_READS

    def __init__(self, name: str, cfg: ScanSettings | None, session: ScanContext):
        self.name, self.cfg = name, cfg
        # only what the kind declares (context.py); a scan built by one that needs it gets its own declared context
        declared = session.for_needed(self) if isinstance(session, DeclaredContext) else DeclaredContext(session, self)
        self.session: ScanContext = declared  # type: ignore[assignment]
        self.variant = self.variant_of(cfg) if cfg is not None else ()
        if self.mode_independent:  # no section names its precision: the file and the entry do
            self.variant = (*self.variant, *session.address.precision)
        self.entry = session.address.entry_name(name, self.variant)  # its record in summary.json
        self.section = None if self.mode_independent else session.address.section
        self.csv = self.path(".csv")
        self.partial = self.path(".partial.csv")  # where a resumable scan keeps its running sums
        self.reduce_seconds = 0.0  # a distributed scan's time in reductions, over its evaluations

    def path(self, ext: str, detail: str = "") -> Path:
        """<run>/ablation/<name><detail><section tag><ext>: this scan's files, named for its mode and metric."""
        return self.session.address.file(f"{self.name}{detail}", ext, self.mode_independent, self.variant)

    def title(self, what: str) -> str:
        """A figure title: the scan, what it shows (with its unit), the mode, then the model and the data."""
        mode = "" if self.mode_independent else f", {self.session.settings.mode} ablation"
        return f"{self.name}: {what}{mode}\n{self.session.subject}"

    # --- what a kind defines ----------------------------------------------------------------------------------

    @classmethod
    def check(cls, name: str, cfg: ScanSettings, settings: AblationConfig) -> None:
        """ConfigError for settings this kind cannot use; needs no model, so it runs before any work."""

    @classmethod
    def variant_of(cls, cfg: ScanSettings) -> tuple[str, ...]:
        """The scan's own settings that change what its result is (not only how it is computed), named in its file
        names and summary.json entry so that two of them keep two results (ablation/records/address.py); () at
        their defaults, so results named before stay where they are."""
        return ()

    def needs(self) -> list[str]:
        """The scans whose results this one reads (scan kinds, or a ranking scan of the session by its name): the
        session runs each before this one and hands their results over (`provided`); nothing else runs a scan."""
        return []

    def optional_needs(self) -> list[str]:
        """The scans whose results this one adds where there is one (their run earlier in this session, or an
        up-to-date result read back) and goes without otherwise: never run for it (importance's single-head column,
        attribution's exact changes)."""
        return []

    def prepare(self) -> None:
        """Checks against the loaded model, at the start of the session, before any scan runs (what needs another
        scan's result is checked when this one runs)."""

    def fingerprint_parts(self) -> tuple:
        """What the table depends on beyond the session's checkpoint, data and settings."""
        return (self.kind,)

    def compute(self, key: str) -> pd.DataFrame | ScanResult:
        """The table (or a ScanResult: the table, further tables and summary entries); writes nothing."""
        raise NotImplementedError

    def figures(self, table: pd.DataFrame) -> list[Path | None]:
        return []

    def typed_table(self, table: pd.DataFrame) -> pd.DataFrame:
        """The table with the column types its CSV loses (a read-back empty cell is "", a bool is "True"), as a new
        frame: what run() hands back and use() reads, computed or read back alike."""
        return table

    def use(self, table: pd.DataFrame) -> None:
        """What follows from the table, computed or read back: summary.json entries, values other scans need. Reads
        the table only (a result is never changed by reading it)."""

    def handed_back(self, table: pd.DataFrame) -> pd.DataFrame:
        """What run() returns: the table, or a new frame with what other results add to it (attribution: every
        head's exact change from an up-to-date single_head scan)."""
        return table

    def recorded_settings(self) -> dict:
        """The scan's own settings its summary.json entry records, so that a rerun under others says what changed
        (path_patching's senders and receivers); {} for a kind whose settings its variant or table already say."""
        return {}

    def record(self) -> dict:
        """The constant columns the table ends with: how it was computed (a result no mode or metric changes says
        only what it read)."""
        if self.mode_independent:
            return {key: value for key, value in self.session.record.items() if key in ("task", "split", "n_eval")}
        return self.session.record

    # --- the cached-result step ------------------------------------------------------------------------------

    def key(self) -> str:
        session_key = self.session.eval_key if self.mode_independent else self.session.key
        return fingerprint(session_key, *self.fingerprint_parts())

    def read_back(self, announce: bool = True) -> pd.DataFrame | None:
        """The table, if it is up to date (a variant's, recorded under the plain name before variants had names of
        their own, first takes its name: one process alone, as the others read the same summary.json)."""
        if self.variant and self.session.world is None and first_process():
            rename = {self.plain_path(ext, d).name: self.path(ext, d).name for d, ext in self.file_names()}
            self.session.files.adopt(self.name, self.entry, self.key(), rename, self.mode_independent)
        return self.session.files.up_to_date(self.entry, self.key(), self.csv, announce, self.mode_independent)

    def plain_path(self, ext: str, detail: str = "") -> Path:
        """Where `path` was before a variant named this scan's files apart: without the variant."""
        return self.session.address.file(f"{self.name}{detail}", ext, self.mode_independent)

    def file_names(self) -> list[tuple[str, str]]:
        """(detail, extension) of each file a kind with variants writes: its table and its figure."""
        return [("", ".csv"), ("", ".png")]

    def run(self, announce: bool = True) -> pd.DataFrame:
        table = self.read_back(announce)
        if table is None:
            key, start = self.key(), time.perf_counter()
            settings = self.recorded_settings()
            result = self.compute(key)
            result = result if isinstance(result, ScanResult) else ScanResult(result)
            table = with_record(result.table, self.record())
            if table.empty:  # never replace a result by an empty one
                raise ConfigError(
                    f"ablation.scans.{self.name}",
                    self.kind,
                    "computed no rows: nothing was written, and any earlier result of it is kept",
                )
            self.refuse_non_finite(table)
            # said once the new table is sure to be written (an empty or non-finite one keeps the earlier result)
            self.session.files.note_replaced(self.entry, key, self.csv, settings, self.mode_independent)
            write_csv(self.csv, table)
            parts = [self.path(".csv", detail) for detail in result.tables]
            for path, part in zip(parts, result.tables.values()):
                write_csv(path, part)
            if result.summary:
                self.session.files.update_summary(result.summary, self.mode_independent)
            discard_partials(self.partial)
            # figures read what the first process wrote (an edge scan's curve, its summary entry): it alone draws
            files = [self.csv, *parts, *(self.figures(table) if first_process() else [])]
            seconds = time.perf_counter() - start
            world, how = self.session.world, {}
            if world is not None and self.reduce_seconds:  # its masks were shared out over the processes
                how = {"processes": world.size, "reduce_seconds": self.reduce_seconds}
            if self.variant:
                how = {**how, "scan": self.name, "variant": list(self.variant)}
            if settings:
                how = {**how, "settings": settings}
            self.session.files.record(
                self.entry, self.kind, key, files, seconds, len(table), self.mode_independent, **how
            )
        table = self.typed_table(table)
        self.use(table)
        return self.handed_back(table)

    def refuse_non_finite(self, table: pd.DataFrame) -> None:
        """ConfigError naming the metric and the first row where a metric column is NaN or infinite: such a table
        was written, then every figure, summary and read-back of it failed."""
        metric = self.session.metric
        columns = [c for column in metric.columns for c in (column, f"delta_{column}") if c in table.columns]
        values = table[columns].apply(pd.to_numeric, errors="coerce").to_numpy(dtype=float)
        bad = ~np.isfinite(values)
        if bad.any():
            row, col = (int(i[0]) for i in np.nonzero(bad))
            where = table["mask"].iloc[row] if "mask" in table.columns else f"row {row}"
            raise ConfigError(
                "ablation.metric",
                metric.name,
                f"is {values[row, col]} for {where} in {self.name}'s {columns[col]} column: nothing was written, and "
                "any earlier result of it is kept",
            )

    def evaluate(self, masks: list[HeadMask], key: str) -> MaskTotals:
        """The masks' metric sums on the session's evaluator, resumable from this scan's partial files; shared out
        over the session's processes when it has several (ablation/records/distributed.py)."""
        session, world = self.session, self.session.world
        label, progress = f"{self.name} ({session.address.section})", session.settings.progress
        positions = session.positions
        totals = evaluate_resumably(session.evaluator, masks, self.partial, key, label, progress, positions, world)
        self.reduce_seconds += 0.0 if world is None else world.reduce_seconds
        return totals

    def per_example(self, inputs, metric, compute) -> dict:
        """An edge scan's per-example evaluation (circuit_inputs.CircuitInputs.per_example) over the session's
        processes, its reduction's time counted as a mask evaluation's."""
        world = self.session.world
        tables = inputs.per_example(world, metric, compute)
        self.reduce_seconds += 0.0 if world is None else world.reduce_seconds
        return tables


def configured_variant(config: DictConfig, name: str) -> tuple[str, ...]:
    """The variant of scan `name` as a run's config (its `ablation.scans.<name>`) sets it; () for a scan it does not
    list: where every reader of a run (findings, reports, the API) finds that scan's files."""
    section = OmegaConf.select(config, f"ablation.scans.{name}", default=None)
    if section is None or section.get("kind") is None:
        return ()
    cfg = typed_scan(name, section)
    return KINDS[cfg.kind].variant_of(cfg)


def typed_scan(name: str, section: Any) -> ScanSettings:
    """Scan `name`'s settings (a config node, a mapping, or settings already typed) as its kind's `Settings`: the one
    place a scan's keys are checked against its kind, so that a key the kind does not take is refused in one line
    naming the kind and what it takes (from an experiment file, the command line or `Run.scan`) rather than ignored."""
    if isinstance(section, ScanSettings):  # typed when composed; `+key=...` on the command line adds attributes
        kind = KINDS.get(section.kind, f"ablation.scans.{name}.kind")
        for key, value, keys in added_attributes(section, ""):  # a nested section's (edge_pruning.stepz)
            if "." in key:
                raise unknown_key(f"ablation.scans.{name}.{key}", value, keys)
        if isinstance(section, kind.Settings) and set(vars(section)) <= {f.name for f in fields(kind.Settings)}:
            return section
        section = dict(vars(section))
    data = OmegaConf.to_container(section) if isinstance(section, DictConfig) else dict(section)
    kind = KINDS.get(data.get("kind"), f"ablation.scans.{name}.kind")
    names = {f.name for f in fields(kind.Settings)}
    for key, value in data.items():
        if key not in names:
            raise not_taken(name, kind.kind, str(key), value)
    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(kind.Settings), data))
    except ConfigKeyError as e:  # a nested section's key (l0_gates' l0.stepz)
        keys = list(e.parent_node.keys()) if e.parent_node is not None else []
        raise unknown_key(
            f"ablation.scans.{name}.{e.full_key}", OmegaConf.select(OmegaConf.create(data), e.full_key), keys
        ) from None
    except ValidationError as e:
        reason = e.msg.splitlines()[0]
        raise ConfigError(f"ablation.scans.{name}.{e.full_key}", e.value, reason) from None


def added_attributes(settings: Any, prefix: str) -> list[tuple[str, Any, list[str]]]:
    """(dotted key, value, the keys its section takes) of each attribute a typed section and its nested dataclass
    sections hold beyond their fields: what `+ablation.scans.<name>.<section>.<key>=...` adds."""
    names = [f.name for f in fields(settings)]
    found = []
    for key, value in vars(settings).items():
        if key not in names:
            found.append((f"{prefix}{key}", value, names))
        elif is_dataclass(value):
            found += added_attributes(value, f"{prefix}{key}.")
    return found


def typed_scans(scans: dict[str, Any]) -> dict[str, ScanSettings]:
    """Every scan's settings typed by its kind (typed_scan)."""
    return {str(name): typed_scan(str(name), section) for name, section in scans.items()}
