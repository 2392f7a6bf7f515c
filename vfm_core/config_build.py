"""The settings builder under every config: YAML 1.2 load/dump, typed coercion, overrides.

:func:`build_settings` turns a (partial) mapping into any settings dataclass (the run config's
sections, the tokenizer's, curation's), checking every key and type; errors are one
:class:`ConfigError` naming the dotted key. :func:`parse_override` reads one
``section.field=value`` string. The run config itself (:class:`vfm_core.config.Config`), its merge
and YAML files live in :mod:`vfm_core.config`; this module never imports it.

Scalars in YAML files and ``--set`` values follow the YAML 1.2 core schema (:class:`YamlLoader`),
not PyYAML's YAML 1.1: ``1e-3``, ``5E+2`` and ``.5`` are numbers, only ``true`` / ``false`` are
booleans (``train.fp8=off`` is the string ``'off'``), ``010`` is ten.
"""

from __future__ import annotations

import dataclasses
import re
import stat
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml

from vfm_core.errors import UserError


class ConfigError(UserError, ValueError):
    """A user-supplied configuration value is wrong; the message names the key."""


_BOOL, _INT, _FLOAT = (f"tag:yaml.org,2002:{t}" for t in ("bool", "int", "float"))
_YAML12 = (  # YAML 1.2.2 section 10.3.2, the core schema: (tag, pattern, first characters)
    (_BOOL, r"true|True|TRUE|false|False|FALSE", "tTfF"),
    (_INT, r"[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+", "-+0123456789"),
    (
        _FLOAT,
        r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?|[-+]?\.(inf|Inf|INF)|\.(nan|NaN|NAN)",
        "-+.0123456789",
    ),
)


def _resolvers(base: dict, *, keep_yaml11: bool) -> dict:
    """``base``'s implicit resolvers with the YAML 1.2 core bool / int / float ones appended;
    the YAML 1.1 ones of those tags dropped unless ``keep_yaml11``."""
    out = {
        ch: [(tag, rx) for tag, rx in arms if keep_yaml11 or tag not in (_BOOL, _INT, _FLOAT)]
        for ch, arms in base.items()
    }
    for tag, pattern, first in _YAML12:
        for ch in first:
            out.setdefault(ch, []).append((tag, re.compile(f"^(?:{pattern})$")))
    return out


MAX_CONFIG_BYTES = 1 << 20
"""A config file larger than this (1 MiB) is refused before it is parsed."""
MAX_DEPTH = 64
"""Collections nested deeper than this are refused (PyYAML's composer recurses per level)."""
MAX_ALIASES = 256
MAX_VALUES = 100_000
"""A document whose aliases expand it to more values than this is refused ("billion laughs":
9 levels of 9 aliases are 9**9 values once the settings builder walks them)."""
MAX_INT_DIGITS = 40


def _limit(problem: str, mark: yaml.Mark | None) -> yaml.composer.ComposerError:
    return yaml.composer.ComposerError(None, None, problem, mark)


class YamlLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` reading plain scalars by the YAML 1.2 core schema (module docstring);
    a key twice in one mapping is an error (YAML 1.2 requires unique keys; PyYAML keeps the last
    and drops the first without a word). Config files are untrusted input: nesting, aliases
    and integers are bounded (:data:`MAX_DEPTH`, :data:`MAX_ALIASES`, :data:`MAX_INT_DIGITS`;
    the expansion of aliases by :func:`parse_yaml`), each a one-line YAML error."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._aliases = 0

    def compose_node(self, parent: yaml.Node | None, index: object) -> yaml.Node:
        mark = self.peek_event().start_mark
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                raise _limit(f"more than {MAX_ALIASES} aliases", mark)
            return super().compose_node(parent, index)
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _limit(f"nested deeper than {MAX_DEPTH} levels", mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> dict:
        if isinstance(node, yaml.MappingNode):
            seen: set = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # '<<: *anchor', merged below
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    twice = key in seen
                except TypeError:  # unhashable: PyYAML's own error below
                    continue
                if twice:
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping",
                        node.start_mark,
                        f"found the key {key!r} twice",
                        key_node.start_mark,
                    )
                seen.add(key)
        return super().construct_mapping(node, deep=deep)

    yaml_implicit_resolvers = _resolvers(yaml.SafeLoader.yaml_implicit_resolvers, keep_yaml11=False)

    def construct_yaml12_int(self, node: yaml.ScalarNode) -> int:
        text = str(self.construct_scalar(node))
        if len(text) > MAX_INT_DIGITS:
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"an integer of {len(text)} digits (at most {MAX_INT_DIGITS})",
                node.start_mark,
            )
        if text.startswith(("0o", "0x")):
            return int(text[2:], 8 if text[1] == "o" else 16)
        return int(text)

    def construct_yaml12_bool(self, node: yaml.ScalarNode) -> bool:
        return str(self.construct_scalar(node)).lower() == "true"


YamlLoader.add_constructor(_INT, YamlLoader.construct_yaml12_int)
YamlLoader.add_constructor(_BOOL, YamlLoader.construct_yaml12_bool)


class YamlDumper(yaml.SafeDumper):
    """``yaml.SafeDumper`` that quotes every string a YAML 1.1 or 1.2 reader would take for
    another type (``'1e3'``, ``'off'``), so a saved config reads back the same with either."""

    yaml_implicit_resolvers = _resolvers(yaml.SafeDumper.yaml_implicit_resolvers, keep_yaml11=True)


def parse_yaml(text: str) -> Any:
    """``text`` parsed as YAML with the YAML 1.2 core schema (:class:`YamlLoader`, a SafeLoader:
    no Python objects), refused (a YAML error) when its aliases expand it past
    :data:`MAX_VALUES` values or make it refer to itself."""
    loader = YamlLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _expanded_values(node, {})
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _expanded_values(node: yaml.Node, memo: dict[int, int]) -> int:
    """How many values ``node`` stands for once every alias is expanded (memoised per node, so
    counting costs one visit of each node however often it is referred to)."""
    key = id(node)
    if key in memo:
        if memo[key] < 0:
            raise _limit("an alias refers to the collection that holds it", node.start_mark)
        return memo[key]
    memo[key] = -1  # in progress: met again below, a cycle
    if isinstance(node, yaml.SequenceNode):
        n = 1 + sum(_expanded_values(c, memo) for c in node.value)
    elif isinstance(node, yaml.MappingNode):
        n = 1 + sum(_expanded_values(k, memo) + _expanded_values(v, memo) for k, v in node.value)
    else:
        n = 1
    if n > MAX_VALUES:
        raise _limit(f"aliases expand it to more than {MAX_VALUES} values", node.start_mark)
    memo[key] = n
    return n


def yaml_problem(e: yaml.YAMLError) -> str:
    """A YAML error in one line: 'line 3, column 2: expected <block end>, but found ...'."""
    mark, problem = getattr(e, "problem_mark", None), getattr(e, "problem", None)
    if mark is not None and problem:
        return f"line {mark.line + 1}, column {mark.column + 1}: {problem}"
    return " ".join(str(e).split())


_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a named pipe"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _read_config_bytes(path: Path) -> bytes:
    """The bytes of a config file: a regular file (a named pipe would block, ``/dev/zero`` never
    ends) of at most :data:`MAX_CONFIG_BYTES`, else a one-line :class:`ConfigError`."""
    mode = path.stat().st_mode
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in _KINDS if test(mode)), "not a file")
        raise ConfigError(f"config file {path}: not a regular file ({kind})")
    with path.open("rb") as f:
        data = f.read(MAX_CONFIG_BYTES + 1)
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"config file {path}: larger than {MAX_CONFIG_BYTES >> 20} MiB")
    return data


def read_yaml(path: str | Path) -> dict[str, Any]:
    """A YAML run config file as a mapping of sections (a key twice is an error, as is a file
    that is not UTF-8 text, not a regular file, over 1 MiB, nested too deep or expanding too
    far through aliases), each problem one line naming the file."""
    path = Path(path)
    try:
        data = parse_yaml(_read_config_bytes(path).decode("utf-8")) or {}
    except OSError as e:
        raise ConfigError(f"config file {path}: cannot read ({e.strerror})") from None
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"config file {path}: not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset "
            f"{e.start})"
        ) from None
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {path}: not valid YAML ({yaml_problem(e)})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: expected a mapping of sections")
    return data


def to_dict(obj: Any) -> Any:
    """Dataclass -> plain dict of YAML/JSON-friendly values (tuples become lists)."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, tuple | list):
        return [to_dict(v) for v in obj]
    return obj


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check ``value`` against annotation ``tp``; return it converted (list->tuple, int->float)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        errors = []
        for arm in typing.get_args(tp):
            if arm is type(None):
                if value is None:
                    return None
                continue
            try:
                return _coerce(value, arm, key)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(f"{key}: expected {_name(tp)}, got {value!r}")
    if origin is Literal:
        if value not in typing.get_args(tp):
            choices = ", ".join(repr(c) for c in typing.get_args(tp))
            raise ConfigError(f"{key}: expected one of {choices}, got {value!r}")
        return value
    if origin is tuple:
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:  # tuple[X, ...]: any length
            if not isinstance(value, list | tuple):
                raise ConfigError(f"{key}: expected a list, got {value!r}")
            return tuple(_coerce(v, args[0], f"{key}[{i}]") for i, v in enumerate(value))
        if not isinstance(value, list | tuple) or len(value) != len(args):
            raise ConfigError(f"{key}: expected a list of {len(args)} values, got {value!r}")
        return tuple(_coerce(v, a, f"{key}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true/false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        return value
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping of fields, got {value!r}")
        return _build(tp, value, key)
    raise ConfigError(f"{key}: unsupported type {tp!r}")  # pragma: no cover - programming error


def _name(tp: Any) -> str:
    """A type as an error reads it: ``bool | Literal['auto']`` -> "true, false or 'auto'"."""
    union = typing.get_origin(tp) in (typing.Union, types.UnionType)
    words = []
    for arm in typing.get_args(tp) if union else (tp,):
        if arm is bool:
            words += ["true", "false"]
        elif typing.get_origin(arm) is Literal:
            words += [repr(c) for c in typing.get_args(arm)]
        else:
            named = {type(None): "null", int: "an integer", float: "a number", str: "a string"}
            words.append(named.get(arm, getattr(arm, "__name__", str(arm))))
    return " or ".join(w for w in [", ".join(words[:-1]), words[-1]] if w)


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def build_settings(cls: type, values: dict[str, Any], *, prefix: str = "") -> Any:
    """Any settings dataclass (the run config's sections, the tokenizer's, curation's) from a
    (partial) mapping: every key known, every value of its field's type (YAML 1.2 numbers,
    lists -> tuples), errors as one :class:`ConfigError` naming ``prefix.key``."""
    return _build(cls, values, prefix)


def _build(cls: type, values: dict[str, Any], prefix: str = "") -> Any:
    """Build dataclass ``cls`` from a (partial) mapping, validating every key and type."""
    hints = _hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for k, v in values.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if k not in known:
            raise ConfigError(f"{key}: unknown key (known: {', '.join(sorted(known))})")
        kwargs[k] = _coerce(v, hints[k], key)
    return cls(**kwargs)


def parse_override(text: str) -> tuple[list[str], Any]:
    """``"model.hidden=512"`` -> (["model", "hidden"], 512), ``"train.lora.rank=8"`` ->
    (["train", "lora", "rank"], 8) (a field of a section's sub-settings); the value is parsed
    as YAML."""
    if "=" not in text:
        raise ConfigError(f"override {text!r}: expected section.field=value")
    key, raw = text.split("=", 1)
    parts = key.strip().lstrip("-").split(".")
    if len(parts) < 2 or not all(parts):
        raise ConfigError(f"override {text!r}: key must be section.field, e.g. model.hidden=512")
    try:
        value = parse_yaml(raw) if raw.strip() else ""
    except yaml.YAMLError as e:
        raise ConfigError(
            f"override {text!r}: value is not valid YAML ({yaml_problem(e)})"
        ) from None
    return parts, value


def override_keys(overrides: list[str] | tuple[str, ...]) -> dict[str, str]:
    """``section.field`` -> the override text that sets it (the last one), to name in errors."""
    keys = {}
    for text in overrides:
        parts, _ = parse_override(text)
        keys[".".join(parts)] = text
    return keys


def put(tree: dict[str, Any], parts: list[str], value: Any) -> None:
    """``tree[parts[0]][parts[1]]... = value``, making the mappings on the way."""
    for part in parts[:-1]:
        tree = tree.setdefault(part, {})
    tree[parts[-1]] = value


def deep_merge(base: dict[str, Any], values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``base`` (a settings tree, :func:`to_dict` form) with ``values`` on top, mapping into
    mapping; a key ``base`` does not have is a ConfigError naming it and the known ones."""
    out = dict(base)
    for k, v in values.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            unknown = set(v) - set(base[k])
            if unknown:
                name = sorted(unknown)[0]
                known = ", ".join(sorted(base[k]))
                raise ConfigError(f"{key}.{name}: unknown key (known: {known})")
            out[k] = deep_merge(base[k], v, key)
        else:
            out[k] = v
    return out


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"train": {"lora": {"rank": 8}}}`` -> ``{"train.lora.rank": 8}``."""
    out: dict[str, Any] = {}
    for k, v in tree.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        out.update(flatten(v, key) if isinstance(v, dict) else {key: v})
    return out


def dotted(obj: Any, key: str) -> Any:
    """The value of dotted ``key`` in a settings object: ``dotted(cfg, "train.lora.rank")``."""
    for part in key.split("."):
        obj = getattr(obj, part)
    return obj


def refuse_disagreement(
    key: str, value: Any, shown: str, below: Any, given: dict[str, str]
) -> None:
    """``value`` for the dotted ``key``, given as ``shown`` (a flag, a form field), where a setting
    (``given``: key -> how it was set, e.g. ``--set parallel.tp=4``) made ``below`` (the config
    without ``value``) hold another one: a ConfigError naming both, instead of either winning
    silently. Equal values, or a key no setting named, are fine."""
    if key in given and dotted(below, key) != value:
        raise ConfigError(f"{shown} but {given[key]}: two values for {key}; keep one of the two")
