"""Training: the LightningModule, the Trainer built from the config, loggers, and the helpers that launch jobs."""
