"""Every config section as a typed dataclass with the checks on it, and the schemas Hydra composes them into.

This package is the bottom of the import order (docs/DESIGN.md): it imports nothing else of headcount but errors.
"""

from headcount.config.schema import (
    CONF_DIR,
    AblateConfig,
    TrainConfig,
    plain,
    register_configs,
    typed,
    validate_train_config,
)

__all__ = ["CONF_DIR", "AblateConfig", "TrainConfig", "plain", "register_configs", "typed", "validate_train_config"]
