"""vfm's library: curation, shards, loading, training, generation, reporting (no Prefect here).

Importing it chooses OpenMP's wait policy before torch loads its OpenMP runtime: threads that
sleep at barriers when the machine is already busy, OpenMP's spinning default when it is idle
(:mod:`vfm_core.openmp`)."""

from vfm_core.openmp import choose_wait_policy as _choose_wait_policy

_choose_wait_policy()
