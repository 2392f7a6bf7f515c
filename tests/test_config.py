from __future__ import annotations

import os
import typing
from pathlib import Path

import pytest

from vfm_core.config import (
    FAMILY_TRAITS,
    RANGES,
    Config,
    ConfigError,
    ModelConfig,
    apply_overrides,
    arch_family,
    dotted,
    load_yaml,
    read_yaml,
    save_yaml,
    validate,
)
from vfm_core.recipes import FAMILIES, RECIPES, get_recipe, recipe_family


def test_overrides_apply_and_coerce():
    cfg = apply_overrides(
        Config(),
        [
            "model.hidden=512",
            "optim.lr=1e-3",
            "model.patch=[1,4,4]",
            "model.kv_heads=2",
            "train.dtype=bfloat16",
            "optim.lr=2",
        ],
    )
    assert cfg.model.hidden == 512
    assert cfg.model.patch == (1, 4, 4)
    assert cfg.model.kv_heads == 2
    assert cfg.optim.lr == 2.0 and isinstance(cfg.optim.lr, float)
    assert cfg.train.dtype == "bfloat16"


@pytest.mark.parametrize(
    "override, needle",
    [
        ("model.hiden=3", "model.hiden: unknown key"),
        ("modle.hidden=3", "modle: unknown key"),
        ("model.hidden=abc", "model.hidden: expected an integer"),
        ("model.hidden=1.5", "model.hidden: expected an integer"),
        ("model.qk_norm=3", "model.qk_norm: expected true/false"),
        ("model.adaln=full", "model.adaln: expected one of 'zero', 'lora'"),
        ("optim.fused=maybe", "optim.fused: expected true, false or 'auto', got 'maybe'"),
        ("model.patch=[1,2]", "model.patch: expected a list of 3"),
        ("hidden=3", "key must be section.field"),
        ("model.hidden", "expected section.field=value"),
    ],
)
def test_bad_overrides_name_the_key(override, needle):
    with pytest.raises(ConfigError, match=needle.replace("[", r"\[")):
        apply_overrides(Config(), [override])


@pytest.mark.parametrize(
    "override, key, value",
    [
        ("optim.lr=1e-3", "optim.lr", 0.001),  # a string under PyYAML's YAML 1.1
        ("optim.lr=5E+2", "optim.lr", 500.0),
        ("optim.lr=.5", "optim.lr", 0.5),
        ("optim.lr=-2.5e-4", "optim.lr", -2.5e-4),  # parsed; validate() refuses it
        ("optim.betas=[.9, 9.95e-1]", "optim.betas", (0.9, 0.995)),
        ("optim.eps=1e-8", "optim.eps", 1e-8),
        ("model.hidden=010", "model.hidden", 10),  # YAML 1.1: octal 8
        ("model.hidden=0x40", "model.hidden", 64),
        ("train.fp8=off", "train.fp8", "off"),  # YAML 1.1: false
        ("train.fp8=on", "train.fp8", "on"),
        ("tracking.run_name=1_000", "tracking.run_name", "1_000"),  # YAML 1.1: 1000
        ("tracking.mlflow=false", "tracking.mlflow", False),
    ],
)
def test_values_parse_as_yaml_1_2(override, key, value, tmp_path):
    section, name = key.split(".")
    got = getattr(getattr(apply_overrides(Config(), [override]), section), name)
    assert got == value and type(got) is type(value)
    path = tmp_path / "c.yaml"  # the same in a YAML file
    raw = override.split("=", 1)[1]
    path.write_text(f"{section}:\n  {name}: {raw}\n")
    assert getattr(getattr(load_yaml(path), section), name) == value


def test_saved_yaml_reads_back_strings_that_look_like_numbers(tmp_path):
    cfg = apply_overrides(Config(), ["tracking.run_name='1e3'", "train.fp8=off", "optim.eps=1e-12"])
    path = tmp_path / "c.yaml"
    save_yaml(cfg, path)
    assert load_yaml(path) == cfg
    assert "run_name: '1e3'" in path.read_text() and "fp8: 'off'" in path.read_text()


def test_yaml_1_1_booleans_are_refused_by_name():
    with pytest.raises(ConfigError, match=r"^tracking.mlflow: expected true/false, got 'yes'$"):
        apply_overrides(Config(), ["tracking.mlflow=yes"])


@pytest.mark.parametrize(
    "override, message",
    [
        ("optim.lr=-1", "optim.lr: must be > 0, got -1.0"),
        ("optim.lr=0", "optim.lr: must be > 0, got 0.0"),
        ("optim.lr=.inf", "optim.lr: must be a finite number, got inf"),
        ("optim.lr=.nan", "optim.lr: must be a finite number, got nan"),
        ("optim.betas=[0.9, 1]", "optim.betas[1]: must be in [0, 1), got 1.0"),
        ("optim.betas=[-0.1, 0.9]", "optim.betas[0]: must be in [0, 1), got -0.1"),
        ("optim.eps=0", "optim.eps: must be > 0, got 0.0"),
        ("optim.weight_decay=-0.1", "optim.weight_decay: must be >= 0, got -0.1"),
        ("optim.warmup_steps=-5", "optim.warmup_steps: must be >= 0, got -5"),
        ("optim.decay_steps=-1", "optim.decay_steps: must be >= 0, got -1"),
        ("optim.min_lr_ratio=1.5", "optim.min_lr_ratio: must be in [0, 1], got 1.5"),
        ("optim.grad_clip=-1", "optim.grad_clip: must be >= 0, got -1.0"),
        ("train.keep_ckpts=-1", "train.keep_ckpts: must be >= 0, got -1"),
        ("train.log_every=0", "train.log_every: must be >= 1, got 0"),
        ("train.ckpt_every=0", "train.ckpt_every: must be >= 1, got 0"),
        ("train.seed=-1", "train.seed: must be in [0, 2**63), got -1"),
        ("train.grad_accum=0", "train.grad_accum: must be >= 1, got 0"),
        ("train.ema_decay=1", "train.ema_decay: must be in [0, 1), got 1.0"),
        ("data.batch_size=0", "data.batch_size: must be >= 1, got 0"),
        ("data.num_captions=0", "data.num_captions: must be >= 1, got 0"),
        ("data.num_workers=-2", "data.num_workers: must be >= 0, got -2"),
        ("data.seed=-3", "data.seed: must be in [0, 2**63), got -3"),
        ("diffusion.sigma_data=0", "diffusion.sigma_data: must be > 0, got 0.0"),
        ("diffusion.sigma_min=-1", "diffusion.sigma_min: must be > 0, got -1.0"),
        (
            "diffusion.sigma_max=0.001",
            "diffusion.sigma_max: must be > diffusion.sigma_min=0.002, got 0.001",
        ),
        ("diffusion.p_std=-1", "diffusion.p_std: must be >= 0, got -1.0"),
        ("diffusion.rho=0", "diffusion.rho: must be > 0, got 0.0"),
        ("diffusion.num_steps=0", "diffusion.num_steps: must be >= 1, got 0"),
        ("diffusion.guidance=-2", "diffusion.guidance: must be >= 0, got -2.0"),
        ("diffusion.cond_dropout=1.5", "diffusion.cond_dropout: must be in [0, 1], got 1.5"),
        ("diffusion.shift=0", "diffusion.shift: must be > 0, got 0.0"),
        ("diffusion.logit_std=-1", "diffusion.logit_std: must be >= 0, got -1.0"),
        ("model.heads=0", "model.heads: must be >= 1, got 0"),  # was a ZeroDivisionError
        ("model.kv_heads=-1", "model.kv_heads: must be >= 1, got -1"),
        ("model.patch=[1, 0, 2]", "model.patch[1]: must be >= 1, got 0"),
        ("model.mlp_ratio=0", "model.mlp_ratio: must be > 0, got 0.0"),
        ("model.rope_theta=-1", "model.rope_theta: must be > 0, got -1.0"),
        ("model.norm_eps=0", "model.norm_eps: must be > 0, got 0.0"),
        ("model.freq_dim=0", "model.freq_dim: must be >= 2, got 0"),
        ("model.freq_dim=255", "model.freq_dim: must be even (a cosine and a sine per"),
        ("model.stdit_full_every=-1", "model.stdit_full_every: must be >= 0, got -1"),
        ("model.abs_pos=-6", "model.abs_pos: must be >= 0, got -6"),
        # absurd sizes: building 10**23 blocks hung, a width of 10**9 overflowed torch's storage
        ("model.depth=99999999999999999999999", "model.depth: must be <= 10000, got 9999"),
        ("model.hidden=1000000000", "model.hidden: must be <= 2**20, got 1000000000"),
        ("model.mlp_ratio=1e12", "model.mlp_ratio: must be <= 1024, got 1000000000000.0"),
        ("model.text_dim=2097152", "model.text_dim: must be <= 2**20, got 2097152"),
    ],
)
def test_out_of_range_values_name_the_key(override, message):
    with pytest.raises(ConfigError) as e:
        validate(apply_overrides(get_recipe("dit-tiny"), [override]))
    assert str(e.value).startswith(message), str(e.value)


def test_every_range_names_a_numeric_field():
    cfg = Config()
    for key, _ in RANGES:
        value = dotted(cfg, key)  # train.lora.rank: a field of a section's sub-settings
        assert value is None or isinstance(value, int | float | tuple), key


@pytest.mark.parametrize(
    "override, needle",
    [
        ("model.heads=3", "model.heads"),
        (
            "data.latent_height=15",
            "data.latent_height: 15 is not a positive multiple of the patch 2",
        ),
        ("train.steps=-1", "train.steps"),
        ("model.kv_heads=3", "model.kv_heads"),
        ("model.abs_pos=8", "model.abs_pos: must be a multiple of 6"),
        # shard settings on synthetic data were ignored: the run trained on synthetic latents
        ("data.shards=/data/web", "data.shards: needs data.source='shards' .*synthetic"),
    ],
)
def test_validate_names_the_key(override, needle):
    with pytest.raises(ConfigError, match=needle):
        validate(apply_overrides(get_recipe("dit-tiny"), [override]))


LATENT_7_TOKENS = ["data.latent_frames=7", "data.latent_height=2", "data.latent_width=2"]


@pytest.mark.parametrize(
    ("recipe", "overrides", "message"),
    [
        (  # 1 token over cp=2: every rank of `vfm train --nproc 2 --cp 2` failed after launch
            "dit-tiny",
            [*LATENT_7_TOKENS, "data.latent_frames=1", "parallel.cp=2"],
            "data.latent_frames/height/width: a 1x2x2 latent in model.patch=1x2x2 pieces is 1 "
            "token, which cannot be split into 2 equal chunks (parallel.cp=2); use latent sizes "
            "whose token count is a multiple of 2",
        ),
        (
            "dit-tiny",
            [*LATENT_7_TOKENS, "parallel.tp=2"],
            "is 7 tokens, which cannot be split into 2 equal chunks (parallel.tp=2 with sequence "
            "parallelism)",
        ),
        (
            "dit-tiny",
            [*LATENT_7_TOKENS, "data.latent_frames=6", "parallel.cp=2", "parallel.tp=2"],
            "is 6 tokens, which cannot be split into 4 equal chunks (parallel.cp=2 x "
            "parallel.tp=2 with sequence parallelism)",
        ),
        (  # the causal family: two balanced chunks per CP rank
            "ar-tiny",
            [
                "data.latent_frames=3",
                "data.latent_height=1",
                "data.latent_width=2",
                "parallel.cp=2",
            ],
            "is 6 tokens, which cannot be split into 4 equal chunks (2 causal chunks per CP rank "
            "x parallel.cp=2)",
        ),
    ],
)
def test_a_sample_must_split_evenly_over_the_ranks_that_cut_its_tokens(recipe, overrides, message):
    with pytest.raises(ConfigError) as e:
        validate(apply_overrides(get_recipe(recipe), overrides))
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    "overrides",
    [
        [*LATENT_7_TOKENS, "parallel.tp=2", "parallel.sequence_parallel=false"],  # not cut by TP
        [*LATENT_7_TOKENS, "data.latent_frames=8", "parallel.cp=2", "parallel.tp=2"],
        # packed: the pack (data.max_tokens) is cut, not the sample (checked on its own)
        [*LATENT_7_TOKENS, "parallel.cp=2", "data.source=shards", "data.max_tokens=8"],
        [*LATENT_7_TOKENS, "parallel.cp=0"],  # a bad degree is resolve_degrees' to name
    ],
)
def test_samples_the_trainer_does_not_cut_unevenly_are_accepted(overrides):
    validate(apply_overrides(get_recipe("dit-tiny"), overrides))


def test_rope_off_needs_absolute_positions():
    cfg = apply_overrides(get_recipe("ar-tiny"), ["model.rope=false", "model.abs_pos=0"])
    with pytest.raises(ConfigError, match="model.rope: false needs model.abs_pos > 0"):
        validate(cfg)
    validate(apply_overrides(get_recipe("ar-tiny"), ["model.rope=false", "model.abs_pos=6"]))


def test_sublayer_fsdp_units_refuse_selective_recompute():
    on = ["parallel.activation_checkpointing=true", "parallel.fsdp_unit=sublayer"]
    for extra in (
        ["parallel.activation_checkpointing_mode=selective"],
        ["parallel.activation_checkpointing_blocks=1"],
    ):
        cfg = apply_overrides(get_recipe("dit-tiny"), on + extra)
        with pytest.raises(ConfigError, match="parallel.fsdp_unit: 'sublayer' cannot combine"):
            validate(cfg)
    validate(apply_overrides(get_recipe("dit-tiny"), on))  # full recompute of every block
    validate(
        apply_overrides(
            get_recipe("dit-tiny"),
            [
                *on[:1],
                "parallel.fsdp_unit=auto",
                "parallel.activation_checkpointing_mode=selective",
            ],
        )
    )


def test_yaml_round_trip_and_errors(tmp_path):
    cfg = apply_overrides(get_recipe("llama-dit-tiny"), ["train.steps=7"])
    path = tmp_path / "c.yaml"
    save_yaml(cfg, path)
    assert load_yaml(path) == cfg
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  depht: 3\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: model.depht: unknown key"):
        load_yaml(bad)
    with pytest.raises(ConfigError, match="cannot read"):
        load_yaml(tmp_path / "missing.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("model:\n  hidden: 64\n bad indent\n")
    with pytest.raises(ConfigError) as e:  # one line, where the problem is
        load_yaml(broken)
    assert "\n" not in str(e.value)
    assert "broken.yaml: not valid YAML (line 3, column 2: expected <block end>" in str(e.value)
    # a section or a key twice (PyYAML would keep the last and drop the first); merges stay
    for text, where in [
        ("model: {depth: 1}\nmodel: {heads: 2}\n", "line 2, column 1: found the key 'model'"),
        ("model:\n  depth: 1\n  depth: 2\n", "line 3, column 3: found the key 'depth'"),
    ]:
        twice = tmp_path / "twice.yaml"
        twice.write_text(text)
        with pytest.raises(ConfigError, match=rf"twice.yaml: not valid YAML \({where} twice\)"):
            load_yaml(twice)
    merged = tmp_path / "merged.yaml"
    merged.write_text("train: &t {steps: 3, seed: 1}\ndata:\n  <<: {batch_size: 2}\n")
    assert load_yaml(merged).data.batch_size == 2
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"model:\n  depth: \xff\n")
    with pytest.raises(
        ConfigError, match=r"binary.yaml: not UTF-8 text \(byte 0xff at offset 16\)"
    ):
        load_yaml(binary)


def test_unknown_recipe_lists_known():
    with pytest.raises(ConfigError, match="unknown recipe 'dit-huge'.*dit-tiny"):
        get_recipe("dit-huge")


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_every_recipe_validates(name):
    validate(get_recipe(name))


def test_flat_params():
    flat = get_recipe("dit-tiny").flat()
    assert flat["model.hidden"] == 256 and flat["recipe"] == "dit-tiny"


def test_a_checkpoint_without_a_newer_model_key_counts_as_its_default():
    """Resume / inference compare the checkpoint's recorded model config with the current one; a
    key added to ModelConfig after the checkpoint was written (mlp_bias, fused_proj) is absent
    there and counts as its default, so older checkpoints keep loading."""
    from vfm_core.config import ModelConfig, model_config_mismatch, to_dict

    now = to_dict(ModelConfig(patch=(1, 2, 2)))
    older = {k: v for k, v in now.items() if k not in ("mlp_bias", "fused_proj")}
    assert model_config_mismatch(older, now, now_label="now") is None
    assert model_config_mismatch(older, {**now, "fused_proj": True}, now_label="now") == (
        "model.fused_proj: checkpoint False vs now True"
    )
    assert model_config_mismatch({**now, "hidden": 128}, now, now_label="config") == (
        f"model.hidden: checkpoint 128 vs config {now['hidden']}"
    )
    ignored = model_config_mismatch(
        {**now, "attn_backend": "te"}, now, now_label="now", ignore=("attn_backend",)
    )
    assert ignored is None


def test_synthetic_run_checks_its_tokenizer_at_the_start(tmp_path):
    """data.tokenizer on synthetic data is kept (generation decodes with it), so a missing
    folder or one of another latent width is the run's error when its source is made, not
    the generation's at its end."""
    from vfm_core.families.sources import make_source
    from vfm_core.tokenizer import CausalVideoAutoencoder, TokenizerConfig, save_tokenizer

    cfg = validate(apply_overrides(get_recipe("dit-tiny"), [f"data.tokenizer={tmp_path}/none"]))
    with pytest.raises(ConfigError, match=r"data.tokenizer: tokenizer weights not found: .*none"):
        make_source(cfg.data, cfg.model)
    save_tokenizer(CausalVideoAutoencoder(TokenizerConfig(latent_channels=8)), tmp_path / "t8")
    cfg = validate(apply_overrides(cfg, [f"data.tokenizer={tmp_path}/t8"]))
    with pytest.raises(ConfigError, match="data.tokenizer: .*8 latent channels"):
        make_source(cfg.data, cfg.model)


def _laughs(levels: int = 9) -> str:
    """The "billion laughs" YAML: ``levels`` lists of 9 aliases of the list before."""
    lines, prev = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]'], "a"
    for name in "bcdefghijk"[: levels - 1]:
        lines.append(f"{name}: &{name} [{', '.join([f'*{prev}'] * 9)}]")
        prev = name
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (_laughs(), "aliases expand it to more than 100000 values"),
        ("train: {steps: " + "[" * 100_000 + "]" * 100_000 + "}\n", "nested deeper than 64"),
        ("train: {steps: " + "9" * 5000 + "}\n", "an integer of 5000 digits (at most 40)"),
        ("train: &t {steps: [*t]}\n", "an alias refers to the collection that holds it"),
        ("# " + "x" * (1 << 20) + "\n", "larger than 1 MiB"),
    ],
    ids=["alias-bomb", "deep-nesting", "huge-int", "self-reference", "over-1-MiB"],
)
def test_hostile_config_files_are_one_line_each(tmp_path, text, problem):
    """Config files are untrusted input: each of these is refused in one line naming the file,
    before the settings builder walks it (the alias bomb used to grow without end there)."""
    path = tmp_path / "run.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_yaml(path)
    assert str(e.value).startswith(f"config file {path}: ") and problem in str(e.value)
    assert "\n" not in str(e.value)


def test_a_config_that_is_not_a_regular_file_is_refused_without_reading_it(tmp_path):
    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)  # opening it to read would block until a writer comes
    for path, kind in ((fifo, "a named pipe"), (Path("/dev/zero"), "a character device")):
        with pytest.raises(ConfigError, match=f"not a regular file \\({kind}\\)"):
            load_yaml(path)
    with pytest.raises(ConfigError, match="not a regular file \\(a directory\\)"):
        load_yaml(tmp_path)


def test_a_few_aliases_and_a_nested_list_still_load(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("train: &t {steps: 3}\nsample: {tags: [[1, 2], [3]]}\nx: *t\n")
    assert read_yaml(path)["x"] == {"steps": 3}


def test_the_family_table_places_every_arch_once():
    """FAMILY_TRAITS is the one arch -> family map: every value of ModelConfig.arch in exactly one
    family; the recipes' families are its names."""
    archs = typing.get_args(typing.get_type_hints(ModelConfig)["arch"])
    listed = [a for t in FAMILY_TRAITS.values() for a in t.archs]
    assert sorted(listed) == sorted(archs) and len(set(listed)) == len(listed)
    assert FAMILIES == tuple(FAMILY_TRAITS) == ("diffusion", "autoregressive")
    assert {(a, arch_family(a).name) for a in archs} == {
        ("dit", "diffusion"),
        ("stdit", "diffusion"),
        ("llama_dit", "diffusion"),
        ("ar", "autoregressive"),
    }
    ar, dit = get_recipe("ar-tiny").model, get_recipe("dit-tiny").model
    assert (ar.family_name, ar.discrete, ar.causal) == ("autoregressive", True, True)
    assert (dit.family_name, dit.discrete, dit.causal) == ("diffusion", False, False)
    assert (recipe_family("ar-tiny"), recipe_family("llama-dit-tiny")) == (
        "autoregressive",
        "diffusion",
    )
    with pytest.raises(ConfigError, match="model.arch 'gpt': expected one of ar, dit, llama_dit"):
        arch_family("gpt")


@pytest.mark.parametrize(
    "override, message",
    [
        ("model.vocab_size=1", "model.vocab_size: must be >= 2 for arch 'ar', got 1"),
        (
            "model.patch=[1,2,2]",
            "model.patch: arch 'ar' predicts one token per latent cell, needs (1, 1, 1), "
            "got (1, 2, 2)",
        ),
    ],
)
def test_a_discrete_family_needs_a_vocabulary_and_one_token_per_cell(override, message):
    with pytest.raises(ConfigError) as e:
        validate(apply_overrides(get_recipe("ar-tiny"), [override]))
    assert str(e.value) == message
    validate(apply_overrides(get_recipe("dit-tiny"), ["model.vocab_size=1"]))  # continuous: unused
