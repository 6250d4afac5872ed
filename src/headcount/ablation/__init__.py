"""Head ablation: masks, modes and metrics, exact scans on the fast evaluator, attribution, importance, pruning
(masked and structural).

`run_ablations(cfg, run_dir)` runs a config's scans on a finished run; `MaskEvaluator` is the engine behind them.
"""

from headcount.ablation.engine.evaluator import MaskEvaluator, MaskTotals
from headcount.ablation.engine.masks import HeadMask, masks_to_gates
from headcount.ablation.engine.modes import Replacements
from headcount.ablation.session import run_ablations

__all__ = ["HeadMask", "MaskEvaluator", "MaskTotals", "Replacements", "masks_to_gates", "run_ablations"]
