"""Parallel training applied from outside the single-device model.

dims.py (ParallelDims -> named DeviceMesh), context.py (ring P2P / all-to-all / ST-DiT hybrid
attention, packed sequences), parallelize.py (TP/SP -> CP -> AC -> FSDP2), pipeline.py (PP stages,
conditioning recomputed per stage; TP / FSDP2 per stage), rng.py (per-dimension RNG, paper
Table 3), trainer.py (ParallelTrainer; synthetic or shard source, model-parallel ranks read a
slice and all-gather) + pipeline_trainer.py (PipelineTrainer, pp > 1) + main.py (torchrun
training), checkpoint.py (resharding DCP checkpoints), comm_stats.py (bytes).
"""
