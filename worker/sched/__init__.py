"""Schedulers: which sequences advance, by how many tokens, in each engine step.

Pure Python: nothing here imports torch or knows the model.
"""
