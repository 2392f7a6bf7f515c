"""Parallel training applied from outside the single-device model.

dims.py (ParallelDims -> named DeviceMesh), context.py (ring P2P / all-to-all / ST-DiT hybrid
attention, packed sequences), parallelize.py (TP/SP -> CP -> AC -> FSDP2), pipeline.py (PP stages,
conditioning recomputed per stage), rng.py (per-dimension RNG, paper Table 3), trainer.py +
main.py (torchrun training), checkpoint.py (resharding DCP checkpoints), comm_stats.py (bytes).
"""
