"""A :class:`~vfm_core.data.samples.LatentSource` over shards, for the trainer
(``data.source: shards``).

Stage order of :meth:`ShardLatentSource.next_batch`: loader step (one bucket = the configured
training shape, so every sample of a batch has it; smaller samples are skipped for every rank alike)
→ per sample: ``latent.npy`` cropped to (T, H, W) when the shard has latents, else the decoded
clip's first frames (``data.clip_start='random'``: a window drawn from (seed, position), in
either case), centre-cropped, to [-1, 1] and encoded with the tokenizer → caption embedding
padded / cut to ``model.text_len`` → :class:`~vfm_core.data.samples.TrainBatch`. Time spent waiting
for data is accumulated in ``data_wait_s`` (the trainer logs its fraction of each step).

Packed (``data.max_tokens > 0``): the loader packs samples of their native sizes (images = one
latent frame, videos of several sizes) into ``data.batch_size`` packs of at most ``max_tokens``
tokens; every latent is cropped to its token grid times the patch (first frames, centre of H and
W), patchified and laid out in the pack by the loader's :class:`~vfm_core.geometry.PackLayout`
(built once, by the plan); token ids (arch ar) fill the pack in the same order.

Bad data: a bad sample is skipped by the loader (named, counted; see :mod:`vfm_core.data.loader`);
a step whose samples were all bad, and a dataset none of whose clips is as large as the training
crop, are one-line errors naming the dataset (the second also the ``data.latent_*`` keys).

Blend (``data.blend``): one loader per dataset and a :class:`~vfm_core.data.blend.BlendedLoader`
that draws each step's dataset from (seed, step), the same on every rank; every dataset is checked
against the model when opened (caption width, latent channels, packs, one text encoder), packed
draw keys are offset by dataset (``POSITION_STRIDE``) and ``dataset_samples`` counts the samples
drawn from each (the trainer logs them as ``data/samples/<name>``). ``data.shards`` is the one
dataset case without the blend: same batches and state as a loader of its own.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import torch

from vfm_core.config import ConfigError, DataConfig, ModelConfig
from vfm_core.data.blend import POSITION_STRIDE, BlendedLoader, dataset_names
from vfm_core.data.buckets import BucketSpec
from vfm_core.data.index_tables import DatasetIndexError
from vfm_core.data.loader import (
    LoaderStateError,
    NoSampleFitsError,
    Sample,
    ShardLoader,
    build_loader,
)
from vfm_core.data.samples import TrainBatch
from vfm_core.data.shard_reader import ShardError
from vfm_core.geometry import pack_latents

log = logging.getLogger(__name__)


def _crop(a: np.ndarray, size: tuple[int, int], axes: tuple[int, int]) -> np.ndarray:
    """Centre crop of two axes of ``a`` to ``size``."""
    sl = [slice(None)] * a.ndim
    for ax, n in zip(axes, size):
        start = (a.shape[ax] - n) // 2
        sl[ax] = slice(start, start + n)
    return a[tuple(sl)]


def _no_latents(s: Sample) -> ConfigError:
    return ConfigError(
        f"data.shards: sample {s.key} holds a clip but no latent (shards written by `vfm shard` "
        "hold clips only): set data.tokenizer=DIR (a tokenizer from `vfm tokenizer train`) to "
        "encode the clips as they load, or train on shards encoded once with "
        "vfm_core.tokenizer.encode_shards"
    )


def _checked_tokenizer(
    data: DataConfig, model: ModelConfig, tokenizer: Any, *, discrete: bool
) -> Any:
    """The tokenizer of ``data.tokenizer`` (None without one), ConfigError when it is missing
    or, for a ``discrete`` model, not a discrete tokenizer of ``model.vocab_size`` ids."""
    if discrete and not data.tokenizer:
        raise ConfigError(
            f"data.tokenizer: arch {model.arch!r} reads shards through a discrete tokenizer "
            "(its FSQ codes in latent.npy, or it encodes the clips); set data.tokenizer=DIR"
        )
    if not data.tokenizer:
        return None
    if tokenizer is None:
        raise ConfigError(
            f"data.tokenizer={data.tokenizer}: the shard source was given no tokenizer "
            "(build it with vfm_core.families.sources.make_source)"
        )
    if discrete and (tokenizer.fsq is None or tokenizer.vocab_size != model.vocab_size):
        have = "continuous" if tokenizer.fsq is None else f"{tokenizer.vocab_size} ids"
        raise ConfigError(
            f"data.tokenizer {data.tokenizer}: a discrete tokenizer with "
            f"model.vocab_size={model.vocab_size} ids is needed, it is {have}"
        )
    return tokenizer


class ShardLatentSource:
    """Latent batches of the configured shape from a shard directory or a weighted blend of
    them (see module docstring)."""

    def __init__(
        self,
        data: DataConfig,
        model: ModelConfig,
        *,
        dp_rank: int = 0,
        dp_size: int = 1,
        mp_group: Any = None,
        tokenizer: Any = None,
        discrete: bool = False,
    ) -> None:
        """``dp_rank`` / ``dp_size``: this rank's share of each global step (``data.batch_size``
        samples of ``dp_size * data.batch_size``). ``mp_group``: the model-parallel ranks that
        share this data-parallel rank; each reads 1/k of the samples and the group all-gathers the
        bytes, so every rank of the group ends with the same batch. ``tokenizer``: the encoder of
        ``data.tokenizer``, loaded by the caller (the data layer runs no network of its own;
        :func:`vfm_core.families.sources.make_source`). ``discrete``: the model trains on token
        ids, the FSQ codes of a discrete tokenizer (the family's
        :attr:`~vfm_core.families.Family.discrete`), not on latents."""
        datasets = data.datasets()  # [(directory, weight)]: data.blend, or data.shards alone
        if not datasets:
            raise ConfigError(
                "data.shards: set the shard directory (or data.blend) for data.source='shards'"
            )
        self.data, self.model = data, model
        self.tokenizer = _checked_tokenizer(data, model, tokenizer, discrete=discrete)
        self.discrete = discrete  # token ids: the FSQ codes of a discrete tokenizer
        self.channels = model.in_channels  # of the latents read or encoded
        ct, cs = 4, 8
        if self.tokenizer is not None:
            ct, cs = self.tokenizer.cfg.temporal_factor, self.tokenizer.cfg.spatial_factor
            if discrete:
                self.channels = self.tokenizer.cfg.latent_channels
        self.ct, self.cs = ct, cs
        self.frames = 1 + ct * (data.latent_frames - 1)  # pixel frames of one training sample
        self.pixels = (data.latent_height * cs, data.latent_width * cs)
        self.packed = data.max_tokens > 0
        shape = BucketSpec(resolutions=(self.pixels,), durations=(self.frames,))
        loader_kw = dict(
            seed=data.seed,
            dp_rank=dp_rank,
            dp_size=dp_size,
            num_workers=data.num_workers,
            batch_size=data.batch_size,
            decode="frames",
            compression=(ct, cs, cs),
            patch=tuple(model.patch),
            buckets=None if self.packed else shape,
            max_tokens=data.max_tokens if self.packed else None,
            prefetch=1,  # read + decode the next step while this one trains (not with mp_group)
            mp_group=mp_group,
        )
        self.urls = [url for url, _ in datasets]
        self.names = dataset_names(self.urls)
        """One unique name per dataset (its directory's basename), for metrics."""
        self.loaders = [self._open(url, loader_kw) for url in self.urls]
        self.loader = self.loaders[0]
        """The first dataset's loader (with ``data.shards`` the only one)."""
        for ld, url in zip(self.loaders, self.urls):
            self._check_dataset(ld, self._where(url))
        self.blend: BlendedLoader | None = None
        if data.blend:
            weights = [w for _, w in datasets]
            self.blend = BlendedLoader(self.loaders, weights, seed=data.seed, names=self.names)
        self.stream: ShardLoader | BlendedLoader = self.blend if self.blend else self.loader
        """Where steps come from: the blend, or the one loader."""
        self.data_wait_s = 0.0
        self.text_record, self.null_text, self.null_length = self._null_caption()
        self.captions_cut = 0  # captions longer than model.text_len tokens (cut, counted)

    def _where(self, url: str) -> str:
        """A dataset as error messages name it."""
        return f"data.blend dataset {url}" if self.data.blend else url

    def _open(self, url: str, loader_kw: dict[str, Any]) -> ShardLoader:
        try:
            return build_loader(shards=url, **loader_kw)
        except DatasetIndexError as e:
            if not self.data.blend:
                raise
            raise ConfigError(f"data.blend: {e}") from None
        except NoSampleFitsError as e:
            raise self._too_small(url, e) from None

    def _too_small(self, url: str, e: NoSampleFitsError) -> ConfigError:
        """No clip of ``url`` is as large as the training crop: the sizes, and the ``data.*`` keys
        (with values) that would fit the largest clip."""
        d = self.data
        if self.packed:
            return ConfigError(f"data.max_tokens={d.max_tokens}: {e} ({self._where(url)})")
        f, h, w = e.largest
        fits = {
            "latent_frames": (d.latent_frames, 1 + (f - 1) // self.ct),
            "latent_height": (d.latent_height, h // self.cs),
            "latent_width": (d.latent_width, w // self.cs),
        }
        change = [f"data.{k}<={most}" for k, (now, most) in fits.items() if now > most]
        keys = ", ".join(f"data.{k}={now}" for k, (now, _) in fits.items())
        return ConfigError(
            f"{self._where(url)}: every clip is smaller than the training crop of {self.frames} "
            f"frames of {self.pixels[0]}x{self.pixels[1]} px ({keys}, tokenizer "
            f"{self.ct}x{self.cs}x{self.cs}); the largest is {f} frames of {h}x{w} px: set "
            f"{', '.join(change) or 'smaller data.latent_* values'}, or train on larger clips"
        )

    def _check_dataset(self, ld: ShardLoader, where: str) -> None:
        """The dataset's samples fit the model: caption width, stored latent channels, and (packed)
        every sample fits one pack. From the index alone."""
        dim = ld.index.embedding_dim
        if dim != self.model.text_dim:
            raise ConfigError(
                f"model.text_dim={self.model.text_dim} but the shards' caption embeddings are "
                f"{dim}-d ({where})"
            )
        channels = ld.index.latent_channels()
        if channels - {self.channels}:
            raise ConfigError(
                f"{where}: stored latents have {sorted(channels)} channels, the model takes "
                f"{self.channels}"
            )
        if self.packed:
            self._check_fits(ld, where)

    def _text_record(self) -> dict[str, Any] | None:
        """The datasets' one text record (index meta ``text``): a blend must share its encoder."""
        records = [ld.index.meta.get("text") for ld in self.loaders]

        def encoder(r: dict[str, Any] | None) -> Any:
            return None if not r else {k: v for k, v in r.items() if k != "null"}

        for url, r in zip(self.urls[1:], records[1:]):
            if encoder(r) != encoder(records[0]):
                raise ConfigError(
                    f"data.blend: {url} holds captions of text encoder {encoder(r)}, "
                    f"{self.urls[0]} of {encoder(records[0])}: a blend needs one encoder"
                )
        return records[0]

    def _null_caption(self) -> tuple[dict[str, Any] | None, torch.Tensor | None, int]:
        """The shards' text record (index meta ``text``), its null caption padded to
        ``(model.text_len, Dt)`` and its length; (None, None, 1) for shards without a record
        (dropped captions are zeros then)."""
        from vfm_core.annotate.text_encoder import TextEncoderError, null_from_record

        record = self._text_record()
        try:
            null = null_from_record(record, self.model.text_dim, where=self._where(self.urls[0]))
        except TextEncoderError as e:
            raise ConfigError(str(e)) from None
        if null is None:
            return None, None, 1
        n = min(len(null), self.model.text_len)
        pad = np.zeros((self.model.text_len - n, null.shape[1]), np.float32)
        return record, torch.from_numpy(np.concatenate([null[:n], pad])), n

    def _check_fits(self, ld: ShardLoader, where: str) -> None:
        """Every sample of the index fits one pack (else the planner would skip it silently)."""
        _, most, worst = ld.geometry.token_extremes()  # from the index's stats when it has them
        if most > self.data.max_tokens:
            key = ld.index.row(worst)["key"]
            raise ConfigError(
                f"data.max_tokens={self.data.max_tokens} is smaller than the largest sample "
                f"({key}: {most} tokens, grid {ld.geometry.grid(worst)}) of "
                f"{where}; set data.max_tokens >= {most}"
            )

    def _window(self, s: Sample, have: int, need: int) -> int:
        """First frame of the ``need`` frames (pixel or latent) a draw trains on out of the clip's
        ``have``: 0, or with ``data.clip_start='random'`` a start drawn from (seed, position)."""
        if self.data.clip_start == "first" or have <= need:
            return 0
        rng = np.random.default_rng((self.data.seed, s.position, 0x57A7))
        return int(rng.integers(have - need + 1))

    def _packed_latent(self, s: Sample) -> torch.Tensor:
        """The sample at its native size, cropped to its token grid times the patch."""
        pt, ph, pw = self.model.patch
        t, h, w = s.grid[0] * pt, s.grid[1] * ph, s.grid[2] * pw
        if s.latent is not None:
            c, lt, lh, lw = s.latent.shape
            if c != self.model.in_channels or lt < t or lh < h or lw < w:
                raise ConfigError(
                    f"{s.key}: latent {s.latent.shape} does not fit model.in_channels="
                    f"{self.model.in_channels} and the patch {tuple(self.model.patch)}"
                )
            t0 = self._window(s, lt, t)
            lat = _crop(s.latent[:, t0 : t0 + t], (h, w), (2, 3))
            return torch.from_numpy(np.ascontiguousarray(lat))  # (C, t, h, w)
        if self.tokenizer is None:
            raise _no_latents(s)
        assert s.frames is not None
        n = 1 + self.ct * (t - 1)
        z = self.tokenizer.encode_frames(  # (C, t, h, w) normalised
            s.frames[self._window(s, len(s.frames), n) :],
            size=(h * self.cs, w * self.cs),
            num_frames=n,
        ).cpu()
        if tuple(z.shape[1:]) != (t, h, w):
            raise ConfigError(
                f"{s.key}: clip encodes to {tuple(z.shape)}, expected (C, {t}, {h}, {w})"
            )
        return z

    def _as_ids(self, latent: torch.Tensor) -> torch.Tensor:
        """Discrete: FSQ codes (C, T, H, W) -> token ids (T, H, W); else the latent as it is."""
        if not self.discrete:
            return latent
        assert self.tokenizer is not None and self.tokenizer.fsq is not None
        return self.tokenizer.fsq.codes_to_indices(latent.movedim(0, -1))

    def _text_length(self, s: Sample) -> int:
        return max(1, min(int(s.txt_emb.shape[0]), self.model.text_len))

    def _packs(self, batch) -> TrainBatch:
        """The step's packs: patch tokens (P, length, C*p) or token ids (P, length), each laid
        out by the loader's layout of the pack."""
        offset = batch.source * POSITION_STRIDE  # unique draw keys over a blend's datasets
        rows, layouts, samples = [], [], []
        for members, layout in zip(batch.pack_members, batch.packs, strict=True):
            if not members:  # every sample of this pack was bad (skipped, logged)
                continue
            ss = [batch.samples[m] for m in members]
            latents = [self._packed_latent(s) for s in ss]  # [(C, t, h, w)]
            if self.discrete:  # one token per latent cell, raster order
                ids = torch.zeros(layout.length, dtype=torch.long)  # padding id 0 (ignored)
                ids[: layout.n_tokens] = torch.cat([self._as_ids(z).flatten() for z in latents])
                rows.append(ids)  # (length,)
            else:
                rows.append(pack_latents(latents, self.model.patch, layout=layout)[0])
            layouts.append(layout)
            samples += ss
        values = torch.stack(rows)  # (P, length, C*p) | (P, length)
        return TrainBatch(
            values=values,
            text=torch.stack([self._text(s) for s in samples]),  # (S, L, Dt)
            text_lengths=torch.tensor([self._text_length(s) for s in samples]),  # (S,)
            keys=[s.key for s in samples],
            positions=[s.position + offset for s in samples],
            layouts=layouts,
        )

    def _latent(self, s: Sample) -> torch.Tensor:
        d = self.data
        if s.latent is not None:
            c, t, h, w = s.latent.shape
            if c != self.channels or t < d.latent_frames:
                raise ConfigError(
                    f"{s.key}: latent {s.latent.shape} does not fit {self.channels} latent "
                    f"channels and data.latent_frames={d.latent_frames}"
                )
            t0 = self._window(s, t, d.latent_frames)
            lat = s.latent[:, t0 : t0 + d.latent_frames]
            lat = _crop(lat, (d.latent_height, d.latent_width), (2, 3))
            return torch.from_numpy(np.ascontiguousarray(lat))  # (C, T, H, W)
        if self.tokenizer is None:
            raise _no_latents(s)
        assert s.frames is not None
        f0 = self._window(s, len(s.frames), self.frames)
        frames = np.ascontiguousarray(s.frames[f0:])  # (F, H, W, 3) uint8
        z = self.tokenizer.encode_frames(frames, size=self.pixels, num_frames=self.frames)
        return z.cpu()  # (C, T, h, w) normalised

    def _text(self, s: Sample) -> torch.Tensor:
        L = self.model.text_len
        if s.txt_emb.shape[0] > L:
            self.captions_cut += 1
            if self.captions_cut == 1:
                log.warning(
                    "%s: caption of %d tokens cut to model.text_len=%d (further cuts are "
                    "counted in captions_cut)",
                    s.key,
                    s.txt_emb.shape[0],
                    L,
                )
        e = torch.from_numpy(np.asarray(s.txt_emb[:L], dtype=np.float32))  # (l, Dt)
        return torch.cat([e, e.new_zeros(L - e.shape[0], e.shape[1])])  # (L, Dt) zero padded

    def next_batch(self) -> TrainBatch:
        t0 = time.perf_counter()
        batch = self.stream.next_batch()
        if not batch.samples:
            raise self._all_bad(batch)
        if self.packed:
            out = self._packs(batch)
        else:
            ss = batch.samples
            values = torch.stack([self._as_ids(self._latent(s)) for s in ss])
            offset = batch.source * POSITION_STRIDE
            out = TrainBatch(  # latents (B, C, T, H, W), or token ids (B, T, H, W) if discrete
                values=values,
                text=torch.stack([self._text(s) for s in ss]),  # (B, L, Dt)
                text_lengths=torch.tensor([self._text_length(s) for s in ss]),  # (B,)
                keys=[s.key for s in ss],
                positions=[s.position + offset for s in ss],
            )
        self.data_wait_s += time.perf_counter() - t0
        return out

    def _all_bad(self, batch: Any) -> ShardError:
        """Every sample of a step was bad: one line naming the dataset, the counts and the first
        reasons (each names its shard and key)."""
        ld = self.loaders[batch.source]
        reasons = "; ".join(batch.skip_reasons[:3]) or "no sample was planned"
        more = len(batch.skip_reasons) - 3
        return ShardError(
            self._where(self.urls[batch.source]),
            f"all {len(batch.skipped)} samples of step {batch.step} were bad ({ld.skipped_total} "
            f"bad samples read so far); first reasons: {reasons}"
            + (f" (+{more} more)" if more > 0 else ""),
        )

    @property
    def dataset_samples(self) -> dict[str, int]:
        """Samples drawn from each dataset of a blend so far, over all data-parallel ranks (part
        of the state); {} without a blend."""
        if self.blend is None:
            return {}
        return dict(zip(self.names, self.blend.samples))

    def state_dict(self) -> dict[str, Any]:
        return self.stream.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the data position; a state saved with another per-rank ``batch_size`` (another
        data-parallel degree at the same global batch) is re-batched when it holds no partial
        batch (see :func:`rebatch_state`); a state of another blend is refused."""
        self.stream.load_state_dict(rebatch_state(state, self.data.batch_size))


def rebatch_state(state: dict[str, Any], batch_size: int) -> dict[str, Any]:
    """``state`` (a shard loader or blend state) for loaders whose per-rank ``batch_size``
    differs.

    The planner's position is global (the same on every rank and valid for any ``dp_size``);
    packed plans queue whole packs, which any batch size hands out in the same order. A
    same-shape (bucket) planner may hold samples waiting for a batch of the old size, or whole
    batches of it: between steps of a one-bucket run (the trainer's) both are empty, so only the
    recorded size changes; otherwise the batches cannot be re-cut the same way and
    :class:`LoaderStateError` says what is pending.
    """
    if state.get("kind") == "blend":  # one shard loader state per dataset
        loaders = [rebatch_state(s, batch_size) for s in state.get("loaders", [])]
        return {**state, "loaders": loaders}
    old = state.get("batch_size")
    if old == batch_size or state.get("kind") != "shard_loader":
        return state  # nothing to convert; the loader checks the rest
    planner = state.get("planner") or {}
    pending = {
        "waiting": sum(len(w) for w in planner.get("waiting", [])),
        "ready": sum(len(r) for r in planner.get("ready", [])),
    }
    if any(pending.values()):
        shown = ", ".join(f"{v} {k}" for k, v in pending.items() if v)
        raise LoaderStateError(
            f"loader state: saved with data.batch_size={old}, now {batch_size}, and its planner "
            f"holds samples of unfinished batches ({shown}); resume with "
            f"data.batch_size={old} per data-parallel rank"
        )
    return {**state, "batch_size": batch_size}
