"""Reports: a sweep's runs compared in tables and figures, and results sent to W&B."""
