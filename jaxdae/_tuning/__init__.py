"""Tuning and batches: optax loops over simulations, losses, parametrizations, checkpointed
sweeps."""
