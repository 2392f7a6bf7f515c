"""A settings dataclass as command-line flags and form fields: each setting declared once.

:func:`field_specs` reads a ``@dataclass`` the way a reader does: each field's name, type
(``Literal`` choices, ``X | None``), default, bounds (``dataclasses.field(metadata=bounds(...))``)
and the first paragraph of the attribute docstring under it (later paragraphs are for readers
of the code). From that one declaration :func:`add_flags` adds argparse
flags (``--dp-shard``, type checked, errors naming the flag) and :func:`form_fields` the pydantic
fields of a Prefect form (``pydantic.create_model``; imported only there). Torch-free, below
every user.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import textwrap
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal

from vfm_core.cli_types import int_at_least, number

BOUNDS = "bounds"
"""The ``dataclasses.field`` metadata key of a field's :func:`bounds`."""


FLAG = "flag"
"""The ``dataclasses.field`` metadata key of a field's :func:`flag`."""


def bounds(
    *,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    inferred: int | None = None,
) -> dict[str, Any]:
    """Field metadata: the value is ``>= ge``, ``> gt`` and ``<= le``, or exactly ``inferred`` (a
    sentinel meaning "worked out from the rest", such as ``dp_shard=-1``)."""
    return {BOUNDS: {"ge": ge, "gt": gt, "le": le, "inferred": inferred}}


def flag(name: str | None = None, *, none_as: float | None = None) -> dict[str, Any]:
    """Field metadata: the flag's name when it is not the field's (``--min-len`` for
    ``min_len_s``); ``none_as``: the flag value that sets an ``X | None`` field to None (a
    command line cannot say None: ``--max-len 0`` = no limit)."""
    return {FLAG: {"name": name, "none_as": none_as}}


@dataclass(kw_only=True, frozen=True, slots=True)
class FieldSpec:
    """One field of a settings dataclass, as declared."""

    name: str
    """The field's name (``dp_shard``); its flag is ``--dp-shard``."""
    type: Any
    """The value type with ``| None`` taken off (``int``, ``str``, ``bool``, ``list[str]``)."""
    optional: bool
    """Whether the annotation allows None."""
    choices: tuple[Any, ...] | None
    """The allowed values of a ``Literal`` field."""
    default: Any
    """The default, or ``dataclasses.MISSING`` for a required field."""
    doc: str
    """The attribute docstring, on one line."""
    ge: float | None = None
    """Smallest allowed value (besides ``inferred``)."""
    gt: float | None = None
    """The allowed values are above this."""
    le: float | None = None
    """Largest allowed value."""
    inferred: int | None = None
    """A value outside the bounds that means "inferred"."""
    metavar: str | None = None
    """The flag's metavar (``field(metadata={"metavar": ...})``)."""
    flag_name: str | None = None
    """The flag, when not ``--name-with-dashes`` (:func:`flag`)."""
    none_as: float | None = None
    """The flag value that means None (:func:`flag`)."""

    @property
    def flag(self) -> str:
        return self.flag_name or "--" + self.name.replace("_", "-")

    @property
    def lowest(self) -> int | None:
        """The smallest value accepted, the inferred sentinel included."""
        if self.ge is None or self.inferred is None:
            return self.ge
        return min(self.ge, self.inferred)


@functools.cache
def attribute_docs(cls: type) -> dict[str, str]:
    """Field name -> the docstring under it, for ``cls`` and its dataclass bases: its first
    paragraph, on one line."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        body = ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0].body  # type: ignore[attr-defined]
        for stmt, nxt in zip(body, body[1:], strict=False):
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                if isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant):
                    first = inspect.cleandoc(nxt.value.value).split("\n\n")[0]
                    docs[stmt.target.id] = " ".join(first.split())
    return docs


def field_specs(cls: type, names: tuple[str, ...] | None = None) -> list[FieldSpec]:
    """The fields of dataclass ``cls`` (those in ``names``, in that order, when given)."""
    hints, docs = typing.get_type_hints(cls), attribute_docs(cls)
    by_name = {f.name: f for f in dataclasses.fields(cls)}
    out = []
    for name in names or tuple(by_name):
        f = by_name[name]
        kind, args = hints[name], ()
        optional = typing.get_origin(kind) in (typing.Union, types.UnionType) and (
            type(None) in typing.get_args(kind)
        )
        if optional:
            (kind,) = [a for a in typing.get_args(kind) if a is not type(None)]
        if typing.get_origin(kind) is Literal:
            args = typing.get_args(kind)
            kind = type(args[0])
        default = f.default
        if f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        out.append(
            FieldSpec(
                name=name,
                type=kind,
                optional=optional,
                choices=args or None,
                default=default,
                doc=docs.get(name, ""),
                metavar=f.metadata.get("metavar"),
                flag_name=f.metadata.get(FLAG, {}).get("name"),
                none_as=f.metadata.get(FLAG, {}).get("none_as"),
                **f.metadata.get(BOUNDS, {}),
            )
        )
    return out


def add_flags(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    cls: type,
    names: tuple[str, ...] | None = None,
    *,
    skip: tuple[str, ...] = (),
    unset: str | None = None,
    required: tuple[str, ...] = (),
    optional: tuple[str, ...] = (),
    show_defaults: bool = False,
) -> None:
    """Add a flag per field of ``cls`` (those in ``names``, less ``skip``): ``--name-with-dashes``
    (or the field's :func:`flag`), its type (numbers checked against the field's bounds, errors
    naming the flag), ``Literal`` choices, the docstring as help. A bool is a ``store_true``
    switch, a ``bool | None`` a ``--x / --no-x`` pair (unset: None), a ``list[str]`` a repeatable
    flag. A field without default is required, unless in ``optional`` (and one in ``required``
    is, whatever its default). ``unset`` (e.g. ``"parallel"``): the flags override the fields of
    that config section, default None (keep the config's), help naming ``section.field``.
    ``show_defaults``: the help ends with the default (one that is not None)."""
    for spec in field_specs(cls, names):
        if spec.name in skip:
            continue
        kwargs: dict[str, Any] = {"dest": spec.name, "help": spec.doc.replace("%", "%%")}
        notes = [f"{spec.none_as:g} = None"] if spec.none_as is not None else []
        if spec.type is bool:
            kwargs["action"] = argparse.BooleanOptionalAction if spec.optional else "store_true"
        elif typing.get_origin(spec.type) is list:
            kwargs |= {"action": "append", "default": []}
        else:
            if parse := _flag_type(spec):
                kwargs["type"] = parse
            if spec.choices:
                kwargs["choices"] = spec.choices
            missing = spec.default is dataclasses.MISSING
            kwargs["required"] = spec.name in required or (missing and spec.name not in optional)
            if not missing and unset is None:
                kwargs["default"] = spec.default
                if show_defaults and spec.default is not None:
                    notes.append("default: %(default)s")
            if spec.flag_name:  # the usage line names the value after the flag
                kwargs["metavar"] = spec.flag[2:].replace("-", "_").upper()
        if spec.metavar:
            kwargs["metavar"] = spec.metavar
        if notes:  # inside the docstring's last sentence
            doc, end = kwargs["help"], "." if kwargs["help"].endswith(".") else ""
            kwargs["help"] = f"{doc.removesuffix('.')} ({'; '.join(notes)}){end}"
        if unset is not None:
            kwargs["help"] = f"{unset}.{spec.name}: {kwargs['help']}"
        parser.add_argument(spec.flag, **kwargs)


def _flag_type(spec: FieldSpec) -> Any:
    """The argparse ``type`` of a number field: its bounds checked, errors naming the flag, the
    field's ``none_as`` value read as None. None for other fields."""
    if spec.type is int:
        low = spec.lowest
        parse = int if low is None else int_at_least(spec.flag, int(low))
    elif spec.type is float:
        parse = number(spec.flag, above=spec.gt, at_least=spec.ge)
    else:
        return None
    if spec.le is None and spec.none_as is None:
        return parse

    def checked(text: str) -> Any:
        if spec.none_as is not None and number(spec.flag)(text) == spec.none_as:
            return None
        value = parse(text)
        if spec.le is not None and value > spec.le:
            raise argparse.ArgumentTypeError(f"{spec.flag} must be <= {spec.le:g}, got {text}")
        return value

    return checked


def out_of_bounds(obj: Any) -> str | None:
    """The first field of dataclass instance ``obj`` outside its bounds, as ``--flag: must be
    >= 1, got 0``; None when every one is inside."""
    for spec in field_specs(type(obj)):
        v = getattr(obj, spec.name)
        if v is None or v == spec.inferred:
            continue
        if spec.ge is not None and v < spec.ge:
            return f"{spec.flag}: must be >= {spec.ge}, got {v}"
        if spec.gt is not None and v <= spec.gt:
            return f"{spec.flag}: must be > {spec.gt}, got {v}"
        if spec.le is not None and v > spec.le:
            return f"{spec.flag}: must be <= {spec.le}, got {v}"
    return None


def form_fields(
    cls: type, names: tuple[str, ...] | None = None, *, optional: bool = False
) -> dict[str, Any]:
    """``pydantic.create_model`` field definitions of dataclass ``cls``'s fields (those in
    ``names``, in that order, when given): the type, the default, ``ge``/``gt``/``le`` from its
    bounds, the docstring as the description. An ``inferred``
    sentinel stays allowed (``dp_shard=-1``) and the values between it and the bounds are
    refused by name. ``optional``: every field ``X | None``, default None meaning "inferred" (the
    sentinel then not allowed: None says it)."""
    from pydantic import AfterValidator, Field

    out: dict[str, Any] = {}
    for spec in field_specs(cls, names):
        kind = Literal[spec.choices] if spec.choices else spec.type
        if optional:
            unset = "inferred" if spec.default == spec.inferred else spec.default
            field = Field(
                None, ge=spec.ge, gt=spec.gt, le=spec.le, description=f"{spec.doc} (unset: {unset})"
            )
            out[spec.name] = (kind | None, field)
            continue
        if spec.inferred is not None and spec.ge is not None and spec.inferred < spec.ge:
            kind = typing.Annotated[kind, AfterValidator(_sentinel_or_bound(spec))]
        out[spec.name] = (
            kind | None if spec.optional else kind,
            Field(spec.default, ge=spec.lowest, gt=spec.gt, le=spec.le, description=spec.doc),
        )
    return out


def _sentinel_or_bound(spec: FieldSpec):
    """A validator refusing the values between a field's inferred sentinel and its bound."""

    def check(v: int) -> int:
        if v != spec.inferred and v < spec.ge:  # type: ignore[operator]
            raise ValueError(f"{spec.name}: use {spec.inferred} (inferred) or a value >= {spec.ge}")
        return v

    return check
