"""Run the loader in another process: restore a saved state and digest N batches, or be one rank
of a gloo group for the model-parallel read-then-gather test."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from datetime import timedelta


def batch_digest(batch) -> str:
    """sha256 over everything a batch holds (keys, pixels, latents, embeddings, packs)."""
    h = hashlib.sha256()
    for s in batch.samples:
        h.update(s.key.encode())
        h.update(s.txt_emb.tobytes())
        for a in (s.frames, s.latent):
            if a is not None:
                h.update(str(a.shape).encode() + a.tobytes())
        if s.mp4 is not None:
            h.update(s.mp4)
    for p in batch.packs or []:
        for t in (p.cu_seqlens, p.sample_ids, p.positions):
            h.update(t.numpy().tobytes())
    h.update(json.dumps(batch.pack_members).encode())
    return h.hexdigest()


def restore_and_run(shards: str, state_path: str, n: int, kwargs_json: str) -> list[str]:
    from vfm_core.data.loader import build_loader

    kwargs = json.loads(kwargs_json)
    loader = build_loader(shards=shards, **kwargs)
    with open(state_path) as f:
        loader.load_state_dict(json.load(f))
    return [batch_digest(loader.next_batch()) for _ in range(n)]


def mp_rank_main(rank: int, world: int, port: int, shards: str, out_dir: str, steps: int) -> None:
    """4 ranks = 2 DP replicas x model-parallel groups of 2: {0,1} and {2,3}."""
    import torch.distributed as dist

    from vfm_core.data.loader import build_loader

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))
    k = 2
    groups = [dist.new_group(list(range(g * k, (g + 1) * k))) for g in range(world // k)]
    group = groups[rank // k]
    loader = build_loader(
        shards=shards, seed=3, dp_rank=rank // k, dp_size=world // k, batch_size=4, mp_group=group
    )
    digests, sizes = [], []
    for _ in range(steps):
        b = loader.next_batch()
        digests.append(batch_digest(b))
        sizes.append(b.bytes_read)
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump({"digests": digests, "bytes": sizes, "total": loader.bytes_read}, f)
    dist.barrier()
    dist.destroy_process_group()
    from vfm_core.parallel.world import exit_process

    exit_process(0)  # a gloo worker thread may outlive finalisation (see exit_process)


if __name__ == "__main__":
    shards, state, n, kwargs = sys.argv[1:5]
    print(json.dumps(restore_and_run(shards, state, int(n), kwargs)))
