"""Attention backends: each stores a step's new K/V in the KV pool and attends over the context."""
