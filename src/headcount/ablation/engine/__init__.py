"""The engine: head masks, ablation modes, metrics and the fast mask evaluator, and what masks are evaluated on.

Nothing here knows about result files or scans (docs/DESIGN.md, "The code")."""
