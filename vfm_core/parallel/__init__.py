"""Parallelism applied from outside the single-device model.

dims.py (ParallelDims -> named DeviceMesh), layout.py (is a config trainable under a layout),
world.py (the process group: torchrun's, or one rank), context.py (ring P2P / all-to-all / ST-DiT
hybrid attention, packed sequences), parallelize.py (TP/SP -> CP -> AC -> FSDP2), pipeline.py (PP
stages, conditioning recomputed per stage; TP / FSDP2 per stage), apply.py (the layout a trainer
runs: parallelize_dit or a pipeline stage), grads.py (global gradient clipping), rng.py
(counter-based draws, paper Table 3), comm_stats.py (bytes). The one trainer that uses them is
vfm_core/train/trainer.py.
"""
