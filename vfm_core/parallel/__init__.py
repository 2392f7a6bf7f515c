"""Parallel training from outside the single-device model: ParallelDims (named DeviceMesh),
context-parallel attention (ring P2P, all-to-all), parallelize_dit (TP/SP -> CP -> AC -> FSDP2),
per-dimension RNG."""
