"""The records: where a result lives (its address), result tables and their fingerprints, summary.json, partial
results of an interrupted scan, and one mask evaluation shared out over many processes."""
