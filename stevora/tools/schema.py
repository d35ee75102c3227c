"""JSON Schema for tool parameters, built once from a function's type hints.

Pydantic does the type-to-schema work; this module adds what providers need on top: the
`$defs` references inlined (several providers reject `$ref`), no pydantic `title` noise,
descriptions from `Annotated[...]` strings and the docstring's `Args:` section, and
`additionalProperties: false`. It also compiles and caches jsonschema validators so the
invoker never compiles a schema on its hot path.
"""

from __future__ import annotations

import inspect
import json
import re
import sys
import types
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Annotated, Any

import pydantic
import typing_extensions
from jsonschema import Draft202012Validator
from jsonschema.protocols import Validator
from jsonschema.validators import validator_for
from pydantic.fields import FieldInfo

from stevora.tools.quick_check import Check, quick_check

# Values that pass through unchanged: JSON decoding already produced the right Python type.
_PASSTHROUGH_TYPES: tuple[Any, ...] = (str, int, float, bool, dict, list, object, Any)
# Keywords whose value is one subschema, a list of them, or a name -> subschema map.
_ONE_SUBSCHEMA = frozenset(
    {
        "items",
        "additionalProperties",
        "not",
        "contains",
        "if",
        "then",
        "else",
        "propertyNames",
        "unevaluatedItems",
        "unevaluatedProperties",
    }
)
_SUBSCHEMA_LISTS = frozenset({"anyOf", "oneOf", "allOf", "prefixItems"})
_SUBSCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "dependentSchemas"})
_SECTION_RE = re.compile(r"^\s*(Args|Arguments|Parameters|Params|Keyword Args|Kwargs)\s*:\s*$")
_ANY_SECTION_RE = re.compile(r"^\s*[A-Z][A-Za-z ]*:\s*$")
_ARG_LINE_RE = re.compile(r"^\s*\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


def is_context_annotation(annotation: Any) -> bool:
    """True for `ToolContext` (marked by a class attribute, which avoids an import cycle)."""
    if typing.get_origin(annotation) is Annotated:
        annotation = typing.get_args(annotation)[0]
    return isinstance(annotation, type) and getattr(annotation, "__stevora_tool_context__", False)


def json_path(parts: Iterable[str | int]) -> str:
    """`("items", 0, "name")` -> `items[0].name`, the path style used in Stevora error details."""
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


@dataclass(frozen=True)
class FunctionSpec:
    """Everything the registry needs from one signature inspection of a `@tool` function."""

    description: str
    parameters: dict[str, Any]
    param_names: frozenset[str]
    required: frozenset[str]
    context_param: str | None
    accepts_var_kwargs: bool
    # Parameters whose JSON value must be converted (models, enums, ...) before the call.
    converters: dict[str, pydantic.TypeAdapter[Any]] = field(default_factory=dict)
    # Parameters whose Python default is a `Field(...)`, which must not reach the function.
    field_defaults: dict[str, FieldInfo] = field(default_factory=dict)
    # From a pydantic-model or TypedDict return annotation: what a result must look like.
    output_schema: dict[str, Any] | None = None


def schema_from_function(fn: Callable[..., Any]) -> tuple[str, dict[str, Any]]:
    """Return `(description, parameters_schema)` for a function, from its hints and docstring."""
    spec = analyse_function(fn)
    return spec.description, spec.parameters


def analyse_function(fn: Callable[..., Any]) -> FunctionSpec:
    """Inspect `fn` once: schema, context parameter, and per-call argument converters."""
    fn_name = getattr(fn, "__name__", repr(fn))
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception as exc:
        raise TypeError(f"Cannot resolve the type hints of tool function {fn_name!r}: {exc}") from exc
    doc = inspect.getdoc(fn) or ""
    arg_docs = _docstring_args(doc)

    fields: dict[str, Any] = {}
    converters: dict[str, pydantic.TypeAdapter[Any]] = {}
    field_defaults: dict[str, FieldInfo] = {}
    param_names: set[str] = set()
    context_param: str | None = None
    accepts_var_kwargs = False
    for index, param in enumerate(inspect.signature(fn).parameters.values()):
        annotation = hints.get(param.name, Any)
        if param.kind is param.VAR_KEYWORD:
            accepts_var_kwargs = True
            continue
        if param.kind is param.VAR_POSITIONAL:
            continue
        if is_context_annotation(annotation):
            context_param = param.name
            continue
        if param.kind is param.POSITIONAL_ONLY:
            raise TypeError(f"Tool function {fn_name!r}: positional-only parameter {param.name!r}")
        base, metadata = _split_annotated(annotation)
        # The docstring description goes first so an explicit Field/Annotated one overrides it;
        # the alias keeps names like `json` or `model_config` from clashing with BaseModel.
        naming = pydantic.Field(alias=param.name, description=arg_docs.get(param.name))
        annotated = Annotated[(base, naming, *metadata)]  # type: ignore[valid-type]
        default = ... if param.default is param.empty else param.default
        fields[f"p{index}"] = (annotated, default)
        param_names.add(param.name)
        if isinstance(param.default, FieldInfo):
            field_defaults[param.name] = param.default
        if not any(base is t for t in _PASSTHROUGH_TYPES):
            target: Any = Annotated[(base, *metadata)] if metadata else base
            converters[param.name] = pydantic.TypeAdapter(target)

    try:
        model = pydantic.create_model(f"{fn_name}_arguments", **fields)
        raw_schema = model.model_json_schema(by_alias=True)
    except pydantic.PydanticUserError as exc:
        raise TypeError(f"Cannot build a JSON Schema for tool function {fn_name!r}: {exc}") from exc

    parameters = inline_refs(raw_schema)
    parameters = strip_titles(parameters)
    parameters.pop("description", None)
    parameters["type"] = "object"
    parameters.setdefault("properties", {})
    parameters["required"] = list(parameters.get("required", []))
    if not accepts_var_kwargs:
        parameters["additionalProperties"] = False
    try:
        output_schema = output_schema_from_return(hints.get("return"))
    except TypeError as exc:
        raise TypeError(
            f"Cannot build an output schema for tool function {fn_name!r} from its {exc}"
        ) from exc
    return FunctionSpec(
        description=_first_paragraph(doc),
        parameters=parameters,
        param_names=frozenset(param_names),
        required=frozenset(parameters["required"]),
        context_param=context_param,
        accepts_var_kwargs=accepts_var_kwargs,
        converters=converters,
        field_defaults=field_defaults,
        output_schema=output_schema,
    )


def output_schema_from_return(annotation: Any) -> dict[str, Any] | None:
    """The JSON Schema of a pydantic model or TypedDict return type; None for anything else
    (a `dict` or `str` return promises no shape worth checking).

    Both `typing.TypedDict` and `typing_extensions.TypedDict` count (`typing.is_typeddict` knows
    only the first before Python 3.12). Raises `TypeError` when no schema can be built."""
    base, _ = _split_annotated(annotation) if annotation is not None else (None, [])
    is_model = isinstance(base, type) and issubclass(base, pydantic.BaseModel)
    if not (is_model or typing_extensions.is_typeddict(base)):
        return None
    try:
        adapter = pydantic.TypeAdapter(typing.cast(Any, _pydantic_compatible(base, frozenset())))
        schema: dict[str, Any] = adapter.json_schema(mode="serialization")
    except (pydantic.PydanticUserError, pydantic.PydanticSchemaGenerationError, NameError) as exc:
        raise TypeError(f"return type {getattr(base, '__name__', base)!r}: {exc}") from exc
    return schema


def _pydantic_compatible(tp: Any, seen: frozenset[int]) -> Any:
    """`tp` with every TypedDict in it rebuilt as a `typing_extensions.TypedDict`.

    Pydantic refuses `typing.TypedDict` before Python 3.12 (its `__required_keys__` and generic
    bases were incomplete there); a non-generic one means the same as the typing_extensions
    class with the same fields and required keys. typing_extensions ones are rebuilt too, since
    their fields may hold a `typing.TypedDict`. Containers (`list[X]`, `X | None`,
    `Annotated[X, ...]`, `dict[str, X]`) are rebuilt around their converted arguments."""
    if sys.version_info >= (3, 12):
        return tp
    if typing_extensions.is_typeddict(tp):
        if id(tp) in seen:
            raise TypeError(f"recursive TypedDict {tp.__name__!r} is not supported before Python 3.12")
        hints = typing.get_type_hints(tp, include_extras=True)
        required = getattr(tp, "__required_keys__", frozenset(hints))
        fields = {}
        for key, hint in hints.items():
            # An explicit Required/NotRequired wins: under `from __future__ import annotations`
            # Python 3.11's typing.TypedDict leaves it out of `__required_keys__`.
            wrapper, inner = _unwrap_required(hint)
            inner = _pydantic_compatible(inner, seen | {id(tp)})
            if wrapper == "required" or (wrapper is None and key in required):
                fields[key] = typing_extensions.Required[inner]
            else:
                fields[key] = typing_extensions.NotRequired[inner]
        converted = typing_extensions.TypedDict(tp.__name__, fields)  # type: ignore[misc]
        converted.__doc__ = tp.__doc__
        return converted
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is None or origin is typing.Literal or not args:
        return tp
    if origin is Annotated:
        return Annotated[(_pydantic_compatible(args[0], seen), *tp.__metadata__)]
    new_args = tuple(a if a is Ellipsis else _pydantic_compatible(a, seen) for a in args)
    if new_args == args:
        return tp
    if origin is types.UnionType or origin is typing.Union:
        return typing.Union[new_args]  # noqa: UP007 - a runtime-built union
    return origin[new_args]


def _unwrap_required(hint: Any) -> tuple[str | None, Any]:
    """`Required[X]` -> ("required", X), `NotRequired[X]` -> ("not_required", X) (either module,
    also inside `Annotated`); anything else -> (None, hint)."""
    required = {typing_extensions.Required, getattr(typing, "Required", None)}
    not_required = {typing_extensions.NotRequired, getattr(typing, "NotRequired", None)}
    metadata: tuple[Any, ...] = ()
    if typing.get_origin(hint) is Annotated:
        hint, metadata = typing.get_args(hint)[0], hint.__metadata__
    origin = typing.get_origin(hint)
    if origin not in required and origin not in not_required:
        return None, Annotated[(hint, *metadata)] if metadata else hint
    inner = typing.get_args(hint)[0]
    return ("required" if origin in required else "not_required"), (
        Annotated[(inner, *metadata)] if metadata else inner
    )


def _split_annotated(annotation: Any) -> tuple[Any, list[Any]]:
    """Unwrap `Annotated`, turning plain-string metadata into `Field(description=...)`."""
    if typing.get_origin(annotation) is not Annotated:
        return annotation, []
    base, *metadata = typing.get_args(annotation)
    return base, [pydantic.Field(description=m) if isinstance(m, str) else m for m in metadata]


def _first_paragraph(doc: str) -> str:
    paragraph = doc.strip().split("\n\n", 1)[0]
    if not paragraph or _ANY_SECTION_RE.match(paragraph.splitlines()[0]):
        return ""
    return " ".join(line.strip() for line in paragraph.splitlines())


def _docstring_args(doc: str) -> dict[str, str]:
    """Parse a Google-style `Args:` section into `{name: description}`."""
    out: dict[str, str] = {}
    lines = doc.splitlines()
    start = next((i for i, line in enumerate(lines) if _SECTION_RE.match(line)), None)
    if start is None:
        return out
    section_indent = len(lines[start]) - len(lines[start].lstrip())
    entry_indent: int | None = None
    current: str | None = None
    for line in lines[start + 1 :]:
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        if indent <= section_indent:
            break  # the next section (Returns:, Raises:, ...) or prose
        if entry_indent is None:
            entry_indent = indent
        match = _ARG_LINE_RE.match(line)
        if indent == entry_indent and match:
            current = match.group(1)
            out[current] = match.group(2).strip()
        elif current is not None:
            out[current] = f"{out[current]} {line.strip()}".strip()
    return out


def _map_subschemas(node: dict[str, Any], fn: Callable[[Any], Any]) -> dict[str, Any]:
    """Apply `fn` to each direct subschema of `node`; data keywords (default, enum) stay as-is."""
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _ONE_SUBSCHEMA and isinstance(value, dict):
            out[key] = fn(value)
        elif key in _SUBSCHEMA_LISTS and isinstance(value, list):
            out[key] = [fn(v) for v in value]
        elif key in _SUBSCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: fn(v) for name, v in value.items()}
        else:
            out[key] = value
    return out


def inline_refs(schema: dict[str, Any]) -> dict[str, Any]:
    """Replace local `#/$defs/X` references with their definitions.

    Recursive models cannot be inlined; their references and definitions are kept.
    """
    defs: dict[str, Any] = schema.get("$defs", {})
    kept: set[str] = set()

    def resolve(node: Any, stack: frozenset[str]) -> Any:
        if not isinstance(node, dict):
            return node
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            name = ref.removeprefix("#/$defs/")
            siblings = {k: v for k, v in node.items() if k != "$ref"}
            if name in stack or name not in defs:
                kept.add(name)
                return _map_subschemas(node, lambda n: resolve(n, stack))
            target = resolve(defs[name], stack | {name})
            return {**target, **_map_subschemas(siblings, lambda n: resolve(n, stack))}
        return _map_subschemas(node, lambda n: resolve(n, stack))

    root = {k: v for k, v in schema.items() if k != "$defs"}
    out: dict[str, Any] = resolve(root, frozenset())
    kept_defs: dict[str, Any] = {}
    while kept.difference(kept_defs).intersection(defs):
        for name in sorted(kept.difference(kept_defs).intersection(defs)):
            kept_defs[name] = resolve(defs[name], frozenset({name}))
    if kept_defs:
        out["$defs"] = kept_defs
    return out


def strip_titles(schema: dict[str, Any]) -> dict[str, Any]:
    """Drop pydantic's generated `title` keywords (a property *named* title is kept)."""
    out = _map_subschemas(schema, strip_titles)
    if isinstance(out.get("title"), str):
        del out["title"]
    return out


_validators_by_id: dict[int, tuple[dict[str, Any], Validator, Check | None]] = {}
_validators_by_text: dict[str, tuple[Validator, Check | None]] = {}
_CACHE_LIMIT = 1024


def compiled_validator(schema: dict[str, Any]) -> Validator:
    """A cached jsonschema validator for `schema` (Draft 2020-12 unless `$schema` says otherwise).

    Looked up by object identity first (the cache holds the schema, so the id stays valid),
    then by canonical JSON text, so an equal schema rebuilt per call is still not recompiled.
    Raises `jsonschema.SchemaError` for an invalid schema.
    """
    return compiled_schema(schema)[0]


def compiled_schema(schema: dict[str, Any]) -> tuple[Validator, Check | None]:
    """`compiled_validator(schema)` and its `quick_check` (None when the schema is outside what
    a quick check knows): `check(value)` True means the validator would find no error."""
    hit = _validators_by_id.get(id(schema))
    if hit is not None and hit[0] is schema:
        return hit[1], hit[2]
    text = json.dumps(schema, sort_keys=True, default=str)
    found = _validators_by_text.get(text)
    if found is None:
        cls = validator_for(schema, default=Draft202012Validator)
        cls.check_schema(schema)
        found = (cls(schema), quick_check(schema))
        if len(_validators_by_text) >= _CACHE_LIMIT:
            _validators_by_text.clear()
        _validators_by_text[text] = found
    if len(_validators_by_id) >= _CACHE_LIMIT:
        _validators_by_id.clear()
    _validators_by_id[id(schema)] = (schema, *found)
    return found
