"""Overrides that shrink a recipe to a run of a few seconds on CPU, shared by the tests that
train (each adds what it is about: steps, checkpoints, tracking)."""

TINY_CPU = [
    "model.hidden=64",
    "model.depth=2",
    "model.text_dim=32",
    "data.batch_size=2",
    "data.latent_height=8",
    "data.latent_width=8",
    "train.device=cpu",
]
