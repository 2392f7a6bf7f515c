"""The contestants of ``benchmarks/peers.py``: the peers' source imported from local checkouts
(never vendored) and, for every comparison, one training step (models) or one batch of 8
(loaders) of vfm and of each peer at matched configurations.

DiT's ``models.py`` imports ``timm.models.vision_transformer``; where that import fails (timm
absent, or its import chain needing torchvision) a stand-in of the three classes DiT uses is
installed under that name, written to timm 1.0's semantics, and one line says so.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.util
import io
import json
import subprocess
import sys
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


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
    """The checkout's commit; a copy of the file inside another repository is no checkout."""
    git = ["git", "-C", repo, "rev-parse"]
    top = subprocess.run([*git, "--show-toplevel"], capture_output=True, text=True).stdout.strip()
    if not top or Path(top).resolve() != Path(repo).expanduser().resolve():
        return "not a git checkout"
    return subprocess.run([*git, "--short", "HEAD"], capture_output=True, text=True).stdout.strip()


# ------------------------------------------------------------------------ contestants
@dataclass(kw_only=True, slots=True)
class Contestant:
    name: str
    step: Callable[[], object]
    """One training step (models) or one batch of 8 (loaders)."""
    units: int
    """Tokens (models) or samples (loaders) per step."""
    unit: str = "tok"


def device_of(args: argparse.Namespace) -> torch.device:
    return torch.device(args.device)


def amp(args: argparse.Namespace) -> contextlib.AbstractContextManager:
    """The forward's precision: bf16 autocast (as nanoGPT's train.py and vfm's trainer run it)
    with ``--dtype bfloat16``, else fp32 (a disabled autocast)."""
    return torch.autocast(args.device, dtype=torch.bfloat16, enabled=args.dtype == "bfloat16")


def vfm_overrides(args: argparse.Namespace) -> list[str]:
    """vfm's run settings for ``--device`` / ``--dtype``; blocks eager unless a contestant says
    ``train.compile=on`` (the default 'auto' compiles on CUDA)."""
    return [f"train.device={args.device}", f"train.dtype={args.dtype}", "train.compile=off"]


def plain_loop(
    model: nn.Module, forward: Callable[[], torch.Tensor], loss_fn, args: argparse.Namespace
) -> Callable:
    """zero_grad, forward and loss (under :func:`amp`), backward, step with torch's default
    AdamW (the for-loop on CPU, foreach on CUDA)."""
    opt = torch.optim.AdamW(model.parameters())
    model.train()

    def step() -> None:
        opt.zero_grad()
        with amp(args):
            loss = loss_fn(forward())
        loss.backward()
        opt.step()

    return step


def plain_contestants(
    name: str, build: Callable[[], nn.Module], fwd, loss_fn, units: int, args: argparse.Namespace
) -> list:
    """``name`` in a plain loop over a model from ``build()`` (``fwd(model)`` -> output) on
    ``--device``, and with ``--compile`` the same over a fresh model whose blocks are compiled
    (``train.compile``)."""
    from vfm_core.parallel.parallelize import compile_each_block

    out = []
    for suffix in ("", " compiled") if args.compile else ("",):
        model = build().to(device_of(args))
        if suffix:
            compile_each_block(model)
        step = plain_loop(model, functools.partial(fwd, model), loss_fn, args)
        out.append(Contestant(name=name + suffix, step=step, units=units))
    return out


MATCHED = [
    "model.text_conditioning=pooled",
    "model.qk_norm=false",
    "model.fused_proj=true",
    "model.rope=false",
]
"""vfm's overrides for the configuration the peers have: the caption as one pooled vector (their
class label / nothing: no cross-attention), no per-head QK norm, q/k/v as one GEMM (timm's
``qkv``, nanoGPT's ``c_attn``), and absolute positions only (DiT's fixed sin-cos, nanoGPT's
learned table: vfm's ``model.abs_pos`` embedding, no RoPE). What stays vfm's own: RMSNorm +
SwiGLU (AR: see :func:`ar_config`). :data:`WITH_ROPE` puts the 3D RoPE back, a row of its own."""

WITH_ROPE = ["model.rope=true"]
"""The matched configuration with vfm's 3D RoPE on top of its absolute positions (the recipes')."""


POOLED = ["model.text_conditioning=pooled"]
"""The recipe's architecture with the caption pooled (no cross-attention): the peers' work per
token, done by the recipe's blocks (QK norm, 3D RoPE, its norms, MLP and AdaLN) — the per-FLOP
comparison of the recipe architecture."""


def variants(recipe, matched) -> list[tuple[str, object, bool]]:
    """(label, config, also through the trainer) of a model section: the recipe (text
    cross-attention), the recipe with its caption pooled (:data:`POOLED`) and the matched
    configuration in a plain loop and the trainer; matched + 3D RoPE in a plain loop (its cost)."""
    from vfm_core.config import apply_overrides

    pooled = apply_overrides(recipe, POOLED)
    with_rope = apply_overrides(matched, WITH_ROPE)
    return [
        ("", recipe, True),
        (" pooled", pooled, True),
        (" matched", matched, True),
        (" matched + RoPE", with_rope, False),
    ]


def trainer_contestants(name: str, cfg, units: int, compiled: bool) -> list:
    """``name``: vfm's ``Trainer.train_step`` of ``cfg`` (its objective, AdamW, clipping,
    schedule; its device, dtype and ``train.compile`` from :func:`vfm_overrides`) on one batch of
    its source, the same every step as the plain loops; with ``compiled`` also the trainer with
    ``train.compile=on``."""
    from vfm_core.config import apply_overrides
    from vfm_core.train.trainer import Trainer

    trainers = [(name, Trainer(cfg))]
    if compiled:
        trainers.append((name + " compiled", Trainer(apply_overrides(cfg, ["train.compile=on"]))))
    batch = trainers[0][1].source.next_batch()
    return [
        Contestant(name=n, step=functools.partial(tr.train_step, batch), units=units)
        for n, tr in trainers
    ]


def dit_contestants(args: argparse.Namespace, dit_mod: types.ModuleType | None) -> list:
    """vfm's DiT as its recipe has it (dit-tiny: text cross-attention over ``model.text_len``
    tokens, QK-norm, AdaLN-LoRA) and ``matched`` to the peer (:data:`MATCHED`, AdaLN-Zero), each
    in a plain loop and through vfm's trainer; the peer in its plain loop."""
    from vfm_core.config import apply_overrides
    from vfm_core.families import build_model
    from vfm_core.recipes import get_recipe

    w, b = args.width, 8
    over = (
        f"model.hidden={w} model.depth=4 model.heads={w // 64} model.in_channels=4 "
        f"model.patch=[1,2,2] data.source=synthetic data.batch_size={b} data.latent_frames=1 "
        "data.latent_height=32 data.latent_width=32 train.ema_decay=0 tracking.mlflow=false"
    )
    recipe = apply_overrides(get_recipe("dit-tiny"), [*over.split(), *vfm_overrides(args)])
    matched = apply_overrides(recipe, [*MATCHED, "model.adaln=zero"])
    g, dev = torch.Generator().manual_seed(0), device_of(args)
    tokens = b * 16 * 16
    out = []
    for label, cfg, trainer in variants(recipe, matched):
        m = cfg.model
        x = torch.randn(b, 4, 1, 32, 32, generator=g).to(dev)  # (B, C, T, H, W)
        c_noise = torch.randn(b, generator=g).to(dev)
        text = torch.randn(b, m.text_len, m.text_dim, generator=g).to(dev)  # (B, L, Dt)
        target = torch.randn(b, 4, 1, 32, 32, generator=g).to(dev)
        out += plain_contestants(
            f"vfm DiT plain{label}",
            functools.partial(build_model, m),
            lambda model, x=x, c=c_noise, t=text: model(x, c, t),
            lambda o, target=target: F.mse_loss(o.float(), target),
            tokens,
            args,
        )
        if trainer:
            out += trainer_contestants(f"vfm DiT trainer{label}", cfg, tokens, args.compile)
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
        ).to(dev)
        px = torch.randn(b, 4, 32, 32, generator=g).to(dev)  # (B, C, H, W)
        t = torch.randint(0, 1000, (b,), generator=g).to(dev)
        y = torch.randint(0, 1000, (b,), generator=g).to(dev)
        ptarget = torch.randn(b, 4, 32, 32, generator=g).to(dev)
        fwd = lambda: peer(px, t, y)  # noqa: E731
        out.append(
            Contestant(
                name="facebookresearch/DiT",
                step=plain_loop(peer, fwd, lambda o: F.mse_loss(o.float(), ptarget), args),
                units=tokens,
            )
        )
    return out


AR_BATCH, AR_GRID = 4, (3, 8, 8)
"""The autoregressive rows' batch and token grid: 192 tokens per sample."""


def ar_config(args: argparse.Namespace, *, matched: bool = False):
    """vfm's causal video transformer at the peer's size: ar-tiny with width W, depth 4, W/64
    heads (kv_heads = heads: multi-head like nanoGPT), vocabulary 1000, batch 4 of its 3x8x8
    synthetic token grids; ``matched``: with :data:`MATCHED` (nanoGPT has no text, no QK norm,
    learned absolute positions) and nanoGPT's exact-GELU MLP without biases and LayerNorm
    (ar-tiny: SwiGLU, RMSNorm)."""
    from vfm_core.config import apply_overrides
    from vfm_core.recipes import get_recipe

    w, heads = args.width, args.width // 64
    t, h, wd = AR_GRID
    over = [f"model.hidden={w}", "model.depth=4", f"model.heads={heads}", f"model.kv_heads={heads}"]
    over += ["model.vocab_size=1000", "data.source=synthetic", f"data.batch_size={AR_BATCH}"]
    over += [f"data.latent_frames={t}", f"data.latent_height={h}", f"data.latent_width={wd}"]
    over += ["train.ema_decay=0", "tracking.mlflow=false", *vfm_overrides(args)]
    if matched:
        over += [*MATCHED, "model.mlp=gelu_exact", "model.mlp_bias=false", "model.norm=layer"]
    return apply_overrides(get_recipe("ar-tiny"), over)


def nanogpt(args: argparse.Namespace, gpt_mod: types.ModuleType, n: int, vocab: int) -> nn.Module:
    """nanoGPT's ``GPT`` at the same size (block size ``n``, no dropout, no biases)."""
    conf = gpt_mod.GPTConfig(
        block_size=n,
        vocab_size=vocab,
        n_layer=4,
        n_head=args.width // 64,
        n_embd=args.width,
        dropout=0.0,
        bias=False,
    )
    with contextlib.redirect_stdout(io.StringIO()):  # it prints parameter counts
        return gpt_mod.GPT(conf)


def ar_contestants(args: argparse.Namespace, gpt_mod: types.ModuleType) -> list:
    from vfm_core.families import build_model
    from vfm_core.models.ar import next_token_loss

    b, grid, dev = AR_BATCH, AR_GRID, device_of(args)
    n, g = int(np.prod(grid)), torch.Generator().manual_seed(1)
    out = []
    for label, cfg, trainer in variants(ar_config(args), ar_config(args, matched=True)):
        m = cfg.model
        ids = torch.randint(0, m.vocab_size, (b, *grid), generator=g).to(dev)  # (B, T, H, W)
        text = torch.randn(b, m.text_len, m.text_dim, generator=g).to(dev)  # (B, L, Dt)
        out += plain_contestants(
            f"vfm AR plain{label}",
            functools.partial(build_model, m),
            lambda model, ids=ids, text=text: model(ids, text),
            lambda o, ids=ids: next_token_loss(o, ids.flatten(1)),
            b * n,
            args,
        )
        if trainer:
            out += trainer_contestants(f"vfm AR trainer{label}", cfg, b * n, args.compile)
    gpt = nanogpt(args, gpt_mod, n, m.vocab_size).to(dev)
    with contextlib.redirect_stdout(io.StringIO()):  # it prints parameter counts
        opt = gpt.configure_optimizers(  # fused AdamW on CUDA, as nanoGPT's train.py
            weight_decay=0.1, learning_rate=3e-4, betas=(0.9, 0.95), device_type=dev.type
        )
    idx = torch.randint(0, m.vocab_size, (b, n), generator=g).to(dev)  # (B, N)
    tgt = torch.randint(0, m.vocab_size, (b, n), generator=g).to(dev)
    gpt.train()

    def gpt_step() -> None:
        opt.zero_grad()
        with amp(args):
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


# ------------------------------------------------------------------------ generation
def sampler_contestants(args: argparse.Namespace) -> list:
    """vfm's DiT sampler (``sample_latent``: the run's Heun steps with classifier-free guidance
    in one batch, the objective's preconditioning) vs a bare loop of exactly the model calls it
    made (recorded once: the same inputs, replayed under ``no_grad``)."""
    from vfm_core.config import apply_overrides
    from vfm_core.families import build_model
    from vfm_core.infer.generate import sample_latent
    from vfm_core.recipes import get_recipe

    w, steps = args.width, 24
    over = (
        f"model.hidden={w} model.depth=4 model.heads={w // 64} model.in_channels=4 "
        "model.patch=[1,2,2] diffusion.sampler=heun"
    )
    cfg = apply_overrides(get_recipe("dit-tiny"), over.split())
    m, dev = cfg.model, device_of(args)
    model = build_model(m).to(dev).eval()
    g = torch.Generator().manual_seed(0)
    noise = torch.randn(1, 4, 1, 32, 32, generator=g).to(dev)  # (1, C, T, H, W): 256 tokens
    text = torch.randn(1, m.text_len, m.text_dim, generator=g).to(dev)
    calls: list[tuple] = []

    def record(_mod, a, kw):
        calls.append(tuple(t.detach().clone() for t in a))

    hook = model.register_forward_pre_hook(record, with_kwargs=True)
    with torch.no_grad(), amp(args):
        sample_latent(model, cfg.diffusion, noise, text, steps=steps, guidance=3.0)
    hook.remove()

    def sampler() -> None:
        with torch.no_grad(), amp(args):
            sample_latent(model, cfg.diffusion, noise, text, steps=steps, guidance=3.0)

    def bare() -> None:
        with torch.no_grad(), amp(args):
            for a in calls:
                model(*a)

    tokens = 256  # one video of 256 latent tokens per step
    return [
        Contestant(name="vfm DiT sampler", step=sampler, units=tokens, unit="video tok"),
        Contestant(name="bare loop of its model calls", step=bare, units=tokens, unit="video tok"),
    ]


def ar_generate_contestants(args: argparse.Namespace, gpt_mod: types.ModuleType | None) -> list:
    """vfm's ``sample_tokens`` (KV cache; and without it) vs nanoGPT's ``GPT.generate`` (no
    cache: the whole prefix again for every token) at the same size: width W, depth 4, vocab
    1000, 192 tokens, batch 4, temperature 1, no guidance, no top-k."""
    from vfm_core.families import build_model
    from vfm_core.infer.ar_sample import SamplingConfig, sample_tokens

    m, b, grid, dev = ar_config(args).model, AR_BATCH, AR_GRID, device_of(args)
    n = int(np.prod(grid))
    vfm = build_model(m).to(dev).eval()
    text = torch.randn(b, m.text_len, m.text_dim, generator=torch.Generator().manual_seed(2))
    text = text.to(dev)  # (B, L, Dt)

    def vfm_gen(cache: bool) -> Callable[[], object]:
        def step() -> None:
            with torch.no_grad(), amp(args):
                sample_tokens(vfm, text, grid, SamplingConfig(seed=0, use_cache=cache))

        return step

    out = [
        Contestant(name="vfm AR sample_tokens (KV cache)", step=vfm_gen(True), units=b * n),
        Contestant(name="vfm AR sample_tokens (no cache)", step=vfm_gen(False), units=b * n),
    ]
    if gpt_mod is not None:
        gpt = nanogpt(args, gpt_mod, n, m.vocab_size).to(dev).eval()
        start = torch.zeros(b, 1, dtype=torch.long, device=dev)

        def gpt_gen() -> None:
            with torch.no_grad(), amp(args):
                gpt.generate(start, max_new_tokens=n - 1)

        out.append(Contestant(name="karpathy/nanoGPT generate", step=gpt_gen, units=b * n))
    return out
