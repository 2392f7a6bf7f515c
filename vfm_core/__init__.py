"""vfm's library: curation, shards, loading, training, generation, reporting (no Prefect here).

Importing it sets one process-wide default before torch loads its OpenMP runtime:
``OMP_WAIT_POLICY=PASSIVE`` (unless the environment sets it), so torch's intra-op threads sleep
at a barrier instead of spinning. On a machine shared with other work, spinning threads take the
cores from the threads they wait for: on this 2-core machine at a load of ~6, a tok-tiny
training step ran 9.3 steps/s passive against 1.9-2.2 with the default policy (1 thread: 6.8-7.0)
and a dit-tiny step 2.9 against 0.22 (1 thread: 2.4), measured interleaved
(``benchmarks/omp_wait.py``). Imported after torch, it changes nothing: set the variable
yourself then."""

import os as _os

_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
