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


class YamlLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` reading plain scalars by the YAML 1.2 core schema (module docstring);
    a key twice in one mapping is an error (YAML 1.2 requires unique keys; PyYAML keeps the last
    and drops the first without a word)."""

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
    """``text`` parsed as YAML with the YAML 1.2 core schema (:class:`YamlLoader`)."""
    return yaml.load(text, Loader=YamlLoader)  # a SafeLoader: no Python objects


def yaml_problem(e: yaml.YAMLError) -> str:
    """A YAML error in one line: 'line 3, column 2: expected <block end>, but found ...'."""
    mark, problem = getattr(e, "problem_mark", None), getattr(e, "problem", None)
    if mark is not None and problem:
        return f"line {mark.line + 1}, column {mark.column + 1}: {problem}"
    return " ".join(str(e).split())


def read_yaml(path: str | Path) -> dict[str, Any]:
    """A YAML run config file as a mapping of sections (a key twice is an error, as is a file
    that is not UTF-8 text), each problem one line naming the file."""
    path = Path(path)
    try:
        data = parse_yaml(path.read_bytes().decode("utf-8")) or {}
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
    """``"model.hidden=512"`` -> (["model", "hidden"], 512); the value is parsed as YAML."""
    if "=" not in text:
        raise ConfigError(f"override {text!r}: expected section.field=value")
    key, raw = text.split("=", 1)
    parts = key.strip().lstrip("-").split(".")
    if len(parts) != 2 or not all(parts):
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
        (section, name), _ = parse_override(text)
        keys[f"{section}.{name}"] = text
    return keys


def refuse_disagreement(
    key: str, value: Any, shown: str, below: Any, given: dict[str, str]
) -> None:
    """``value`` for the dotted ``key``, given as ``shown`` (a flag, a form field), where a setting
    (``given``: key -> how it was set, e.g. ``--set parallel.tp=4``) made ``below`` (the config
    without ``value``) hold another one: a ConfigError naming both, instead of either winning
    silently. Equal values, or a key no setting named, are fine."""
    section, _, name = key.partition(".")
    if key in given and getattr(getattr(below, section), name) != value:
        raise ConfigError(f"{shown} but {given[key]}: two values for {key}; keep one of the two")
