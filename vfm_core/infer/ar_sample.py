"""Sampling video tokens from the causal video transformer, one token at a time.

Each step draws the next token of every video in raster order from
``softmax(guided logits / temperature)`` cut to the top-k and the top-p nucleus; ``temperature 0``
is greedy. Classifier-free guidance mixes logits: ``u + g * (c - u)`` with ``u`` from the run's
null caption (zeros by default: what caption dropout trains). With the KV cache each step runs
one position; without it every step reruns the whole prefix (the reference the cache is tested
against). The first cached forward — the prompt's prefill — goes through ``prefill``
(:func:`local_prefill`, or :class:`vfm_core.infer.ar_prefill.SplitPrefill` over context-parallel
ranks); every later step feeds one position.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from vfm_core.errors import UserError
from vfm_core.geometry import Grid
from vfm_core.models.ar import CausalVideoTransformer
from vfm_core.models.attention import KVCache

Prefill = Callable[
    [CausalVideoTransformer, torch.Tensor, torch.Tensor, torch.Tensor, list[KVCache]], torch.Tensor
]
"""(model, inputs (B', m), text (B', L, Dt), rope (m, d/2), empty caches) -> logits (B', V) of
the last input; fills the caches with the m positions' keys and values."""


class SamplingError(UserError, ValueError):
    """Sampling parameters or a prompt that cannot be used."""


@dataclass(kw_only=True, slots=True)
class SamplingConfig:
    temperature: float = 1.0
    """Softmax temperature; 0 = greedy (argmax)."""
    top_k: int = 0
    """Keep the k most likely tokens (0 = all)."""
    top_p: float = 1.0
    """Keep the smallest set of tokens whose probability reaches p, in (0, 1]."""
    guidance: float = 1.0
    """Classifier-free guidance scale (1 = conditional only)."""
    seed: int = 0
    """Seed of the token draws."""
    use_cache: bool = True
    """Decode with the KV cache (False: rerun the prefix every step)."""

    def check(self) -> None:
        """Each setting named by its ``vfm generate`` flag and its field."""
        t, k, p = self.temperature, self.top_k, self.top_p
        if not (math.isfinite(t) and t >= 0):
            raise SamplingError(
                f"--temperature {t}: must be a finite number >= 0 (temperature; 0 = greedy)"
            )
        if not 0 < p <= 1:
            raise SamplingError(f"--top-p {p}: must be a number in (0, 1] (top_p)")
        if k < 0:
            raise SamplingError(f"--top-k {k}: must be an integer >= 0 (top_k; 0 = all tokens)")
        if not self.guidance >= 0:
            raise SamplingError(f"guidance: must be >= 0, got {self.guidance}")


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """(B, V) logits with everything outside the top-k / top-p nucleus set to -inf."""
    if top_k and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[..., -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)  # (B, V)
        probs = sorted_logits.softmax(-1)
        # drop a token when the tokens before it already reach top_p (the first always stays)
        drop = probs.cumsum(-1) - probs >= top_p
        logits = logits.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))
    return logits


def draw(logits: torch.Tensor, cfg: SamplingConfig, gen: torch.Generator) -> torch.Tensor:
    """(B, V) guided logits -> (B,) token ids."""
    if cfg.temperature == 0:
        return logits.argmax(-1)
    probs = filter_logits(logits.float() / cfg.temperature, cfg.top_k, cfg.top_p).softmax(-1)
    return torch.multinomial(probs.cpu(), 1, generator=gen).squeeze(-1).to(logits.device)


def local_prefill(
    model: CausalVideoTransformer,
    inputs: torch.Tensor,  # (B', m) input ids
    text: torch.Tensor,  # (B', L, Dt)
    rope: torch.Tensor,  # (m, d/2)
    caches: list[KVCache],
) -> torch.Tensor:
    """One-device prefill: one forward over the m inputs; logits (B', V) of the last."""
    return model.forward_ids(inputs, text, rope, caches=caches)[:, -1]


@torch.no_grad()
def sample_tokens(
    model: CausalVideoTransformer,
    text: torch.Tensor,  # (B, L, Dt) caption embeddings
    grid: Grid,
    cfg: SamplingConfig,
    *,
    prompt: torch.Tensor | None = None,  # (B, P) first tokens in raster order, kept as given
    null_text: torch.Tensor | None = None,  # (1 | B, L, Dt) unconditional caption (default zeros)
    prefill: Prefill = local_prefill,
    progress: Callable[[int], None] | None = None,  # called after each drawn token with the count
) -> torch.Tensor:
    """Tokens (B, T, H, W) of ``grid``: the prompt, then sampled continuations. ``prefill`` runs
    the first cached forward (BOS and the prompt: P + 1 inputs)."""
    cfg.check()
    n = grid[0] * grid[1] * grid[2]
    b = text.shape[0]
    device = next(model.parameters()).device
    prompt = torch.zeros(b, 0, dtype=torch.long, device=device) if prompt is None else prompt
    if prompt.ndim != 2 or prompt.shape[0] != b:
        raise SamplingError(f"prompt tokens: expected ({b}, P), got {tuple(prompt.shape)}")
    if prompt.shape[1] > n:
        raise SamplingError(
            f"prompt of {prompt.shape[1]} tokens is longer than the video's {n} tokens "
            f"(grid {tuple(grid)})"
        )
    model.check_tokens(prompt)
    guided = cfg.guidance != 1.0
    null = torch.zeros_like(text) if null_text is None else null_text.to(text).expand_as(text)
    texts = torch.cat([text, null]) if guided else text  # (B | 2B, L, Dt)
    rope = model.rope(grid, device)  # (N, d/2)
    gen = torch.Generator().manual_seed(cfg.seed)
    ids = torch.full((b, n), -1, dtype=torch.long, device=device)
    ids[:, : prompt.shape[1]] = prompt
    caches = model.new_caches(n) if cfg.use_cache else None
    done = 0  # positions whose inputs went through the model (cache mode)

    def inputs_of(lo: int, hi: int) -> torch.Tensor:
        """Input ids (B | 2B, hi - lo) of positions lo..hi-1, ``model.shift_right(ids)[:, lo:hi]``
        without shifting all N ids at every step."""
        x = ids[:, max(lo - 1, 0) : hi - 1]  # (B, hi - lo - [lo == 0])
        if lo == 0:
            x = torch.cat([ids.new_full((b, 1), model.bos), x], dim=1)  # (B, hi)
        return torch.cat([x, x]) if guided else x

    def logits_at(i: int) -> torch.Tensor:
        """Guided logits (B, V) of position i given ids[:, :i]."""
        nonlocal done
        if caches is None:
            out = model.forward_ids(inputs_of(0, i + 1), texts, rope[: i + 1])[:, -1]
        else:  # feed every position not yet seen (the prompt's in one prefill)
            run = prefill if done == 0 else local_prefill
            out = run(model, inputs_of(done, i + 1), texts, rope[done : i + 1], caches)
            done = i + 1
        if guided:
            cond, uncond = out.chunk(2)
            return uncond + cfg.guidance * (cond - uncond)
        return out  # (B, V)

    for i in range(prompt.shape[1], n):
        ids[:, i] = draw(logits_at(i), cfg, gen)
        if progress is not None:
            progress(i + 1 - prompt.shape[1])
    return ids.view(b, *grid)
