"""vfm side by side with the public reference implementations, at matched configurations.

    .venv/bin/python benchmarks/peers.py --dit-repo DIR --nanogpt-repo DIR [--rounds 5]
        [--steps 2] [--width 512] [--clips 48] [--threads 1] [--only dit,ar,loader] [--json]

One process, CPU fp32, one intra-op thread by default (on a shared machine a second OpenMP
thread waits at every op's barrier for a free core: measured on 2 cores at load 11, a
(4, 192, 64) multiply took 38 ms and a width-64 AR step 2-15 s, against 0.1 s with one thread;
``--threads 0`` keeps torch's default). The contestants of a section are interleaved in every
round (the order reversed every other round, so a drift of the machine's speed hits all sides
alike); a ratio is vfm / peer of the same round, reported as the median over rounds with min
and max. The peers' source is imported from the local checkouts given (never vendored); a
comparison whose checkout is not given is skipped with one line.

1. DiT, plain loop (zero_grad, forward, MSE against a random target, backward, AdamW step;
   batch 8 of 4x32x32 latents, patch 2 -> 256 tokens/sample, depth 4, width W, W/64 heads):
   vfm's DiT (recipe dit-tiny: text cross-attention over ``model.text_len`` tokens, QK-norm,
   3D RoPE, AdaLN-LoRA) vs facebookresearch/DiT ``DiT`` (class labels, AdaLN-Zero).
2. The same model through vfm's ``Trainer.train_step`` (EDM objective, clipping, schedule) vs
   the peer's plain loop, and vfm's trainer vs vfm's plain loop.
3. Autoregressive: vfm's causal video transformer (recipe ar-tiny with kv_heads = heads, i.e.
   multi-head like the peer; grid 3x8x8 = 192 tokens, vocab 1000, batch 4, next-token loss)
   vs karpathy/nanoGPT ``GPT`` with its own loss and ``configure_optimizers``.
4. Loader, decode on, batches of 8 over the same tars (``--clips`` synthetic H.264 clips made
   by ``benchmarks/loader.py``'s ``make_dataset``): vfm's shard loader (checksums on, its
   defaults) with 0 reader threads (its default) and with 2 vs ``webdataset.WebDataset`` +
   PyAV decode of every sample's mp4 to uint8 frames (+ its json and text embedding).

FLOPs per token: ``torch.utils.flop_counter.FlopCounterMode`` over one training step with
SDPA restricted to its math backend (the CPU flash kernel has no FLOP formula in torch 2.13
and would count 0); it counts matmuls, convolutions and attention only, so the optimizer adds
nothing: the count is that of forward + backward. Top ops: ``torch.profiler`` of one step by
self CPU time (models); ``cProfile`` by own time for the loaders, whose work is Python and
PyAV, not aten ops.

DiT's ``models.py`` imports ``timm.models.vision_transformer``; where that import fails (timm
absent, or its import chain needing torchvision) a stand-in of the three classes DiT uses is
installed under that name, written to timm 1.0's semantics, and one line says so.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import importlib.util
import io
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile
from torch.utils.flop_counter import FlopCounterMode

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SECTIONS = ("dit", "ar", "loader")


# ------------------------------------------------------------------------ peers' source
def timm_standin() -> types.ModuleType:
    """``PatchEmbed``, ``Attention``, ``Mlp`` as timm 1.0 defines them (timm/layers/
    patch_embed.py, attention.py, mlp.py), with only the options DiT uses."""

    class PatchEmbed(nn.Module):
        def __init__(self, img_size=224, patch_size=16, in_chans=3, embed_dim=768, bias=True):
            super().__init__()
            self.img_size, self.patch_size = (img_size, img_size), (patch_size, patch_size)
            self.grid_size = (img_size // patch_size, img_size // patch_size)
            self.num_patches = self.grid_size[0] * self.grid_size[1]
            self.proj = nn.Conv2d(in_chans, embed_dim, patch_size, stride=patch_size, bias=bias)

        def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, C, H, W)
            return self.proj(x).flatten(2).transpose(1, 2)  # (B, N, D)

    class Attention(nn.Module):
        def __init__(
            self, dim, num_heads=8, qkv_bias=False, proj_bias=True, attn_drop=0.0, proj_drop=0.0
        ):
            super().__init__()
            self.num_heads, self.head_dim = num_heads, dim // num_heads
            self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
            self.attn_drop = nn.Dropout(attn_drop)
            self.proj = nn.Linear(dim, dim, bias=proj_bias)
            self.proj_drop = nn.Dropout(proj_drop)

        def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, N, C)
            b, n, c = x.shape
            qkv = self.qkv(x).reshape(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
            q, k, v = qkv.unbind(0)  # (B, H, N, d) each
            p = self.attn_drop.p if self.training else 0.0
            x = F.scaled_dot_product_attention(q, k, v, dropout_p=p)  # (B, H, N, d)
            return self.proj_drop(self.proj(x.transpose(1, 2).reshape(b, n, c)))  # (B, N, C)

    class Mlp(nn.Module):
        def __init__(
            self,
            in_features,
            hidden_features=None,
            out_features=None,
            act_layer=nn.GELU,
            bias=True,
            drop=0.0,
        ):
            super().__init__()
            hidden, out = hidden_features or in_features, out_features or in_features
            self.fc1 = nn.Linear(in_features, hidden, bias=bias)
            self.act = act_layer()
            self.drop1 = nn.Dropout(drop)
            self.fc2 = nn.Linear(hidden, out, bias=bias)
            self.drop2 = nn.Dropout(drop)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.drop2(self.fc2(self.drop1(self.act(self.fc1(x)))))

    mod = types.ModuleType("timm.models.vision_transformer")
    mod.PatchEmbed, mod.Attention, mod.Mlp = PatchEmbed, Attention, Mlp
    return mod


def ensure_timm() -> None:
    """Import timm's ViT layers, or install :func:`timm_standin` in their place (one line)."""
    try:
        import timm.models.vision_transformer  # noqa: F401

        return
    except Exception as e:  # absent, or timm's own imports failing (torchvision)
        reason = f"{type(e).__name__}: {e}"
    for name in ("timm", "timm.models"):
        sys.modules[name] = types.ModuleType(name)
    sys.modules["timm.models.vision_transformer"] = standin = timm_standin()
    sys.modules["timm.models"].vision_transformer = standin
    print(
        f"timm.models.vision_transformer not importable ({reason}): using the stand-in "
        "PatchEmbed/Attention/Mlp written to timm 1.0's semantics"
    )


def load_peer(repo: str, file: str, name: str, flag: str) -> types.ModuleType:
    """Import ``file`` of the checkout ``repo`` as module ``name`` (its source, not a copy)."""
    path = Path(repo).expanduser() / file
    if not path.is_file():
        raise SystemExit(f"{flag} {repo}: no {file} there (expected a checkout of that repo)")
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    with contextlib.redirect_stdout(io.StringIO()):  # nanoGPT prints its parameter count
        spec.loader.exec_module(mod)
    return mod


def commit(repo: str) -> str:
    r = subprocess.run(
        ["git", "-C", repo, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return r.stdout.strip() or "not a git checkout"


# ------------------------------------------------------------------------ contestants
@dataclass(kw_only=True, slots=True)
class Contestant:
    name: str
    step: Callable[[], object]
    """One training step (models) or one batch of 8 (loaders)."""
    units: int
    """Tokens (models) or samples (loaders) per step."""
    unit: str = "tok"


def plain_loop(model: nn.Module, forward: Callable[[], torch.Tensor], loss_fn) -> Callable:
    """zero_grad, forward, loss, backward, step with torch's default AdamW."""
    opt = torch.optim.AdamW(model.parameters())
    model.train()

    def step() -> None:
        opt.zero_grad()
        loss_fn(forward()).backward()
        opt.step()

    return step


def dit_contestants(args: argparse.Namespace, dit_mod: types.ModuleType | None) -> list:
    from vfm_core.config import apply_overrides
    from vfm_core.models.dit import build_model
    from vfm_core.recipes import get_recipe
    from vfm_core.train.trainer import Trainer

    w, b = args.width, 8
    over = (
        f"model.hidden={w} model.depth=4 model.heads={w // 64} model.in_channels=4 "
        f"model.patch=[1,2,2] data.source=synthetic data.batch_size={b} data.latent_frames=1 "
        "data.latent_height=32 data.latent_width=32 train.ema_decay=0 train.device=cpu "
        "tracking.mlflow=false"
    )
    cfg = apply_overrides(get_recipe("dit-tiny"), over.split())
    m, tokens = cfg.model, b * 16 * 16
    g = torch.Generator().manual_seed(0)
    x = torch.randn(b, 4, 1, 32, 32, generator=g)  # (B, C, T, H, W)
    c_noise, text = torch.randn(b, generator=g), torch.randn(b, m.text_len, m.text_dim, generator=g)
    vfm = build_model(m)
    target = torch.randn(b, 4, 1, 32, 32, generator=g)
    out = [
        Contestant(
            name="vfm DiT plain",
            step=plain_loop(vfm, lambda: vfm(x, c_noise, text), lambda o: F.mse_loss(o, target)),
            units=tokens,
        )
    ]
    trainer = Trainer(cfg)
    batch = trainer.source.next_batch()  # the same batch every step, as the plain loops
    out.append(
        Contestant(name="vfm DiT trainer", step=lambda: trainer.train_step(batch), units=tokens)
    )
    if dit_mod is not None:
        peer = dit_mod.DiT(
            input_size=32,
            patch_size=2,
            in_channels=4,
            hidden_size=w,
            depth=4,
            num_heads=w // 64,
            learn_sigma=False,
            num_classes=1000,
        )
        px = torch.randn(b, 4, 32, 32, generator=g)  # (B, C, H, W)
        t, y = torch.randint(0, 1000, (b,), generator=g), torch.randint(0, 1000, (b,), generator=g)
        ptarget = torch.randn(b, 4, 32, 32, generator=g)
        fwd = lambda: peer(px, t, y)  # noqa: E731
        out.append(
            Contestant(
                name="facebookresearch/DiT",
                step=plain_loop(peer, fwd, lambda o: F.mse_loss(o, ptarget)),
                units=tokens,
            )
        )
    return out


def ar_contestants(args: argparse.Namespace, gpt_mod: types.ModuleType) -> list:
    from vfm_core.config import apply_overrides
    from vfm_core.models.ar import next_token_loss
    from vfm_core.models.dit import build_model
    from vfm_core.recipes import get_recipe

    w, b, heads, grid = args.width, 4, args.width // 64, (3, 8, 8)
    over = [f"model.hidden={w}", "model.depth=4", f"model.heads={heads}", f"model.kv_heads={heads}"]
    m = apply_overrides(get_recipe("ar-tiny"), over + ["model.vocab_size=1000"]).model
    n, g = int(np.prod(grid)), torch.Generator().manual_seed(1)
    ids = torch.randint(0, m.vocab_size, (b, *grid), generator=g)  # (B, T, H, W)
    text = torch.randn(b, m.text_len, m.text_dim, generator=g)  # (B, L, Dt)
    vfm = build_model(m)
    out = [
        Contestant(
            name="vfm AR plain",
            step=plain_loop(
                vfm, lambda: vfm(ids, text), lambda o: next_token_loss(o, ids.flatten(1))
            ),
            units=b * n,
        )
    ]
    conf = gpt_mod.GPTConfig(
        block_size=n,
        vocab_size=m.vocab_size,
        n_layer=4,
        n_head=heads,
        n_embd=w,
        dropout=0.0,
        bias=False,
    )
    with contextlib.redirect_stdout(io.StringIO()):  # it prints parameter counts
        gpt = gpt_mod.GPT(conf)
        opt = gpt.configure_optimizers(
            weight_decay=0.1, learning_rate=3e-4, betas=(0.9, 0.95), device_type="cpu"
        )
    idx = torch.randint(0, m.vocab_size, (b, n), generator=g)  # (B, N)
    tgt = torch.randint(0, m.vocab_size, (b, n), generator=g)
    gpt.train()

    def gpt_step() -> None:
        opt.zero_grad()
        _, loss = gpt(idx, tgt)
        loss.backward()
        opt.step()

    return out + [Contestant(name="karpathy/nanoGPT", step=gpt_step, units=b * n)]


def loader_contestants(shards: Path) -> list:
    import av
    import webdataset as wds

    from vfm_core.data.loader import build_loader

    out = []
    for workers in (0, 2):
        ld = build_loader(shards=str(shards), seed=0, batch_size=8, num_workers=workers)
        out.append(
            Contestant(name=f"vfm loader w{workers}", step=ld.next_batch, units=8, unit="samples")
        )

    def decode(sample: dict) -> tuple:
        with av.open(io.BytesIO(sample["mp4"])) as c:
            frames = np.stack([f.to_ndarray(format="rgb24") for f in c.decode(video=0)])
        emb = np.load(io.BytesIO(sample["txt_emb.npy"]), allow_pickle=False)
        return frames, emb, json.loads(sample["json"])  # frames (T, H, W, 3) uint8

    urls = sorted(str(p) for p in shards.glob("*.tar"))
    ds = wds.WebDataset(urls, shardshuffle=False).map(decode)

    def forever() -> Iterator:
        while True:
            yield from ds

    it = forever()
    batch8 = lambda: [next(it) for _ in range(8)]  # noqa: E731
    return out + [Contestant(name="webdataset+PyAV", step=batch8, units=8, unit="samples")]


# ------------------------------------------------------------------------ measurement
def race(cs: list[Contestant], rounds: int, steps: int, warmup: int) -> dict[str, list[float]]:
    """Units/s of every contestant per round; within a round each runs ``steps`` steps."""
    for c in cs:
        for _ in range(warmup):
            c.step()
    rates: dict[str, list[float]] = {c.name: [] for c in cs}
    for r in range(rounds):
        for c in cs if r % 2 == 0 else cs[::-1]:
            t0 = time.perf_counter()
            for _ in range(steps):
                c.step()
            rates[c.name].append(steps * c.units / (time.perf_counter() - t0))
    return rates


def flops_per_unit(c: Contestant) -> float:
    """FLOPs of one step (forward + backward: see the module docstring) per token."""
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as fc:
        c.step()
    return fc.get_total_flops() / c.units


def top_ops(c: Contestant, model: bool, k: int = 5) -> list[dict]:
    """The ``k`` ops (torch.profiler, models) or functions (cProfile, loaders) of one step
    with the most self time."""
    if model:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            c.step()
        events = prof.key_averages()
        total = sum(e.self_cpu_time_total for e in events) or 1.0
        top = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:k]
        return [
            {"op": e.key, "ms": e.self_cpu_time_total / 1e3, "share": e.self_cpu_time_total / total}
            for e in top
        ]
    pr = cProfile.Profile()
    pr.runcall(c.step)
    st = pstats.Stats(pr).stats  # {(file, line, fn): (cc, nc, tottime, cumtime, callers)}
    total = sum(v[2] for v in st.values()) or 1.0
    top = sorted(st.items(), key=lambda kv: kv[1][2], reverse=True)[:k]
    return [
        {"op": f"{Path(f).name}:{fn}", "ms": v[2] * 1e3, "share": v[2] / total}
        for (f, _, fn), v in top
    ]


def measure(cs: list[Contestant], args: argparse.Namespace, steps: int, model: bool) -> dict:
    rates = race(cs, args.rounds, steps, warmup=args.warmup)
    res = {}
    for c in cs:
        fpu = flops_per_unit(c) if model else None
        rate = statistics.median(rates[c.name])
        res[c.name] = {
            "unit": c.unit,
            "rate": rate,
            "rates": rates[c.name],
            "flops_per_unit": fpu,
            "gflops_s": fpu * rate / 1e9 if fpu else None,
            "top_ops": top_ops(c, model),
        }
    return res


def compare(label: str, a: str, b: str, res: dict) -> dict:
    ratios = [x / y for x, y in zip(res[a]["rates"], res[b]["rates"])]
    return {
        "row": label,
        "vfm": a,
        "peer": b,
        "ratio": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
    }


# ------------------------------------------------------------------------ report
def print_report(out: dict) -> None:
    cfg = out["config"]
    if not out["rows"]:
        return
    print(
        f"\n## vfm vs peers (torch {cfg['torch']}, CPU fp32, {cfg['threads']} thread(s), "
        f"{cfg['cores']} cores at load {cfg['load_avg']:.1f}, width {cfg['width']}, "
        f"{cfg['rounds']} rounds x {cfg['steps']} steps)"
    )
    print(
        "| row | vfm | peer | unit | vfm /s | peer /s | vfm/peer median (min-max) | "
        "vfm MFLOP/tok | peer MFLOP/tok | vfm GFLOP/s | peer GFLOP/s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    c = out["contestants"]
    f = lambda v, s: "-" if v is None else format(v, s)  # noqa: E731
    for r in out["rows"]:
        a, b = c[r["vfm"]], c[r["peer"]]
        print(
            f"| {r['row']} | {r['vfm']} | {r['peer']} | {a['unit']} | {a['rate']:.0f} | "
            f"{b['rate']:.0f} | {r['ratio']:.3f} ({r['ratio_min']:.3f}-{r['ratio_max']:.3f}) | "
            f"{f(a['flops_per_unit'] and a['flops_per_unit'] / 1e6, '.1f')} | "
            f"{f(b['flops_per_unit'] and b['flops_per_unit'] / 1e6, '.1f')} | "
            f"{f(a['gflops_s'], '.1f')} | {f(b['gflops_s'], '.1f')} |"
        )
    print("\ntop 5 by self CPU time of one step (models: torch.profiler; loaders: cProfile)")
    for name, v in c.items():
        ops = ", ".join(f"{o['op']} {o['share']:.0%}" for o in v["top_ops"])
        print(f"- {name}: {ops}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dit-repo", help="checkout of facebookresearch/DiT (its models.py)")
    ap.add_argument("--nanogpt-repo", help="checkout of karpathy/nanoGPT (its model.py)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=2, help="model steps per contestant per round")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps per contestant")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (0: default)")
    ap.add_argument("--width", type=int, default=512, help="model width (heads: width / 64)")
    ap.add_argument("--clips", type=int, default=48, help="loader: clips (one epoch per round)")
    ap.add_argument("--only", default=",".join(SECTIONS), help="comma list of dit, ar, loader")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    only = set(args.only.split(","))
    if bad := only - set(SECTIONS):
        ap.error(f"--only: unknown section(s) {sorted(bad)} (choose from {', '.join(SECTIONS)})")
    if args.width % 64:
        ap.error(f"--width {args.width}: must be a multiple of 64 (heads of 64 channels)")
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    out: dict = {
        "config": {
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "load_avg": os.getloadavg()[0],
            "cores": os.cpu_count(),
            **{k: v for k, v in vars(args).items() if k != "json"},
        },
        "rows": [],
        "contestants": {},
        "skipped": [],
    }

    def skip(line: str) -> None:
        print(f"skipped: {line}")
        out["skipped"].append(line)

    if "dit" in only:
        dit = None
        if args.dit_repo:
            ensure_timm()
            dit = load_peer(args.dit_repo, "models.py", "peer_dit_models", "--dit-repo")
            out["config"]["dit_commit"] = commit(args.dit_repo)
        else:
            skip("DiT vs facebookresearch/DiT (no --dit-repo); vfm trainer vs plain loop only")
        res = measure(dit_contestants(args, dit), args, args.steps, model=True)
        out["contestants"].update(res)
        if dit is not None:
            out["rows"].append(
                compare("DiT plain loop", "vfm DiT plain", "facebookresearch/DiT", res)
            )
            out["rows"].append(
                compare("DiT trainer vs peer loop", "vfm DiT trainer", "facebookresearch/DiT", res)
            )
        out["rows"].append(compare("vfm trainer / plain", "vfm DiT trainer", "vfm DiT plain", res))
    if "ar" in only:
        if args.nanogpt_repo:
            gpt = load_peer(args.nanogpt_repo, "model.py", "peer_nanogpt_model", "--nanogpt-repo")
            out["config"]["nanogpt_commit"] = commit(args.nanogpt_repo)
            res = measure(ar_contestants(args, gpt), args, args.steps, model=True)
            out["contestants"].update(res)
            out["rows"].append(compare("AR plain loop", "vfm AR plain", "karpathy/nanoGPT", res))
        else:
            skip("AR vs karpathy/nanoGPT (no --nanogpt-repo)")
    if "loader" in only:
        if importlib.util.find_spec("webdataset") is None:
            skip("loader vs webdataset+PyAV (webdataset not installed)")
        else:
            from benchmarks.loader import make_dataset

            with tempfile.TemporaryDirectory(prefix="vfm-peers-") as tmp:
                shards = make_dataset(Path(tmp), args.clips)
                cs = loader_contestants(shards)
                res = measure(cs, args, max(1, args.clips // 8), model=False)
            out["contestants"].update(res)
            for w in (0, 2):
                row = f"loader, {w} workers" + (" (default)" if w == 0 else "")
                out["rows"].append(compare(row, f"vfm loader w{w}", "webdataset+PyAV", res))
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        print_report(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
