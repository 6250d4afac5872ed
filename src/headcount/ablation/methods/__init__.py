"""The methods beyond exact mask evaluation: attribution patching, gradient importance, pruning orders, L0 gates,
structural pruning and direct effects. Each works on a model, batches and a metric; none writes files."""
