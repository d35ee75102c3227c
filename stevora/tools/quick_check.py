"""A quick yes for tool arguments that are certainly valid, before the full JSON Schema validator.

jsonschema's `iter_errors` costs about 40 Python calls for a one-property object (it builds a
resolver resource, evolves the validator per subschema and dispatches every keyword); the tool
loop validates every call's arguments. Most tool schemas use a small part of JSON Schema, and
for that part a check compiled once per schema answers with a handful of comparisons.

`quick_check(schema)` returns a predicate that says `True` only when jsonschema would find **no**
error; `False` means "not certain", and the caller then asks the real validator (which also
words the errors). So a predicate may be stricter than JSON Schema (it refuses any value that is
not exactly `str`, `int`, `float`, `bool`, `None`, `list` or `dict`, and `1.0` for `integer`),
never looser. It returns `None` for a schema using anything outside that part:

* `type` (a name or a list of names), `enum` and `const` of strings, integers, booleans and
  null, `minLength` / `maxLength`, `minimum` / `maximum` / numeric `exclusiveMinimum` /
  `exclusiveMaximum`, `properties`, `required`, `additionalProperties`, `minProperties` /
  `maxProperties`, `items` (one schema for every item), `minItems` / `maxItems`, `anyOf`,
  `allOf`, the boolean schemas;
* annotations, which validate nothing: `title`, `description`, `default`, `examples`,
  `$comment`, `deprecated`, `readOnly`, `writeOnly`, `format` (not asserted: the validators are
  built without a format checker), and `$defs` / `definitions` (only reached through `$ref`,
  which is outside the part);
* at the root, `$schema` naming draft 4, 6, 7, 2019-09 or 2020-12 (the part means the same in all).

tests/unit/tools/test_quick_check.py checks the promise against jsonschema on generated schemas.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Check = Callable[[Any], bool]

_NONE = type(None)
_JSON_TYPES = frozenset({str, int, float, bool, _NONE, list, dict})
_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),  # 1.0 is an integer to JSON Schema: not certain here, so left to jsonschema
    "number": (int, float),
    "boolean": (bool,),
    "null": (_NONE,),
    "array": (list,),
    "object": (dict,),
}
_ANNOTATIONS = frozenset(
    {
        "title",
        "description",
        "default",
        "examples",
        "$comment",
        "deprecated",
        "readOnly",
        "writeOnly",
        "format",
        "$defs",
        "definitions",
    }
)
_KEYWORDS = frozenset(
    {
        "type",
        "enum",
        "const",
        "minLength",
        "maxLength",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "properties",
        "required",
        "additionalProperties",
        "minProperties",
        "maxProperties",
        "items",
        "minItems",
        "maxItems",
        "anyOf",
        "allOf",
    }
)
_DRAFTS = frozenset(
    f"{base}{suffix}"
    for base in (
        "http://json-schema.org/draft-04/schema",
        "http://json-schema.org/draft-06/schema",
        "http://json-schema.org/draft-07/schema",
        "https://json-schema.org/draft/2019-09/schema",
        "https://json-schema.org/draft/2020-12/schema",
    )
    for suffix in ("", "#")
)


class _Unsupported(Exception):
    pass


# A compiled subschema: `True` (anything is valid), a frozenset (valid iff the value's exact type
# is in it), or a predicate.
_Compiled = bool | frozenset[type] | Check


def quick_check(schema: Any) -> Check | None:
    """A predicate that is `True` only for values `schema` certainly accepts, or `None` when the
    schema uses more of JSON Schema than this module knows (see the module docstring)."""
    if isinstance(schema, dict) and "$schema" in schema:
        if schema["$schema"] not in _DRAFTS:
            return None
        schema = {k: v for k, v in schema.items() if k != "$schema"}
    try:
        compiled = _compile(schema)
    except _Unsupported:
        return None
    if compiled is True:
        return _anything
    if compiled is False:
        return _nothing
    if isinstance(compiled, frozenset):
        types = compiled
        return lambda value: type(value) in types
    return compiled


def _anything(value: Any) -> bool:
    return type(value) in _JSON_TYPES


def _nothing(value: Any) -> bool:
    return False


def _number(value: Any) -> bool:
    return type(value) in (int, float)


def _count(value: Any) -> bool:
    return type(value) is int and value >= 0


def _compile(node: Any) -> _Compiled:
    if node is True or node is False:
        return node
    if not isinstance(node, dict):
        raise _Unsupported
    keys = node.keys() - _ANNOTATIONS
    if not keys <= _KEYWORDS:
        raise _Unsupported
    types = _types(node["type"]) if "type" in node else None
    if keys <= {"type"}:
        return True if types is None else types
    return _compile_checks(node, types)


def _types(spec: Any) -> frozenset[type]:
    names = [spec] if isinstance(spec, str) else spec
    if not isinstance(names, list) or not names or not all(isinstance(n, str) and n in _TYPES for n in names):
        raise _Unsupported
    return frozenset(t for n in names for t in _TYPES[n])


def _members(node: dict[str, Any]) -> tuple[frozenset[str], frozenset[int], frozenset[bool], bool] | None:
    if "enum" in node and "const" in node:
        raise _Unsupported
    if "enum" in node:
        members = node["enum"]
        if not isinstance(members, list):
            raise _Unsupported
    elif "const" in node:
        members = [node["const"]]
    else:
        return None
    if not all(type(m) in (str, int, bool, _NONE) for m in members):
        raise _Unsupported  # floats, arrays, objects: JSON Schema's equality is not Python's
    return (
        frozenset(m for m in members if type(m) is str),
        frozenset(m for m in members if type(m) is int),
        frozenset(m for m in members if type(m) is bool),
        any(m is None for m in members),
    )


def _bound(node: dict[str, Any], key: str, valid: Callable[[Any], bool]) -> Any:
    if key not in node:
        return None
    value = node[key]
    if not valid(value):
        raise _Unsupported  # e.g. draft 4's boolean exclusiveMinimum
    return value


def _subschemas(node: dict[str, Any], key: str) -> tuple[_Compiled, ...] | None:
    if key not in node:
        return None
    items = node[key]
    if not isinstance(items, list) or not items:
        raise _Unsupported
    return tuple(_compile(item) for item in items)


def _compile_checks(node: dict[str, Any], types: frozenset[type] | None) -> Check:
    members = _members(node)
    min_length, max_length = _bound(node, "minLength", _count), _bound(node, "maxLength", _count)
    minimum, maximum = _bound(node, "minimum", _number), _bound(node, "maximum", _number)
    ex_min, ex_max = _bound(node, "exclusiveMinimum", _number), _bound(node, "exclusiveMaximum", _number)
    strings = min_length is not None or max_length is not None
    numbers = minimum is not None or maximum is not None or ex_min is not None or ex_max is not None
    properties = node.get("properties", {})
    if not isinstance(properties, dict):
        raise _Unsupported
    if not all(isinstance(name, str) for name in properties):
        raise _Unsupported
    props = {name: _compile(sub) for name, sub in properties.items()}
    required = node.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise _Unsupported
    required = tuple(dict.fromkeys(required))
    extra = _compile(node.get("additionalProperties", True))
    min_props, max_props = _bound(node, "minProperties", _count), _bound(node, "maxProperties", _count)
    objects = bool(props or required) or extra is not True or min_props is not None or max_props is not None
    items = _compile(node.get("items", True))
    if isinstance(node.get("items"), list):
        raise _Unsupported  # draft 4-7 tuple form
    min_items, max_items = _bound(node, "minItems", _count), _bound(node, "maxItems", _count)
    arrays = items is not True or min_items is not None or max_items is not None
    all_of, any_of = _subschemas(node, "allOf"), _subschemas(node, "anyOf")

    def check(value: Any) -> bool:  # one function: a call per keyword would cost more
        t = type(value)
        if t not in _JSON_TYPES or (types is not None and t not in types):
            return False
        if members is not None:
            strs, ints, bools, null = members
            if not (
                (t is str and value in strs)
                or (t is int and value in ints)
                or (t is bool and value in bools)
                or (value is None and null)
            ):
                return False
        if t is str:
            if strings:
                n = len(value)
                if (min_length is not None and n < min_length) or (max_length is not None and n > max_length):
                    return False
        elif t is int or t is float:
            if numbers and (
                (minimum is not None and value < minimum)
                or (maximum is not None and value > maximum)
                or (ex_min is not None and value <= ex_min)
                or (ex_max is not None and value >= ex_max)
            ):
                return False
        elif t is dict:
            if objects:
                for name in required:
                    if name not in value:
                        return False
                for name in value:
                    sub = props[name] if name in props else extra
                    if sub is True:
                        continue
                    if type(sub) is frozenset:  # `_holds`, inlined: the usual property
                        if type(value[name]) not in sub:
                            return False
                    elif sub is False or not sub(value[name]):  # type: ignore[operator]
                        return False
                if min_props is not None or max_props is not None:
                    n = len(value)
                    if (min_props is not None and n < min_props) or (max_props is not None and n > max_props):
                        return False
        elif t is list and arrays:
            if items is not True:
                for item in value:
                    if not _holds(items, item):
                        return False
            if min_items is not None or max_items is not None:
                n = len(value)
                if (min_items is not None and n < min_items) or (max_items is not None and n > max_items):
                    return False
        if all_of is not None:
            for sub in all_of:
                if not _holds(sub, value):
                    return False
        if any_of is not None:
            for sub in any_of:
                if _holds(sub, value):
                    break
            else:
                return False
        return True

    return check


def _holds(compiled: _Compiled, value: Any) -> bool:
    if compiled is True:  # the empty schema looks at nothing, not even the value's type
        return True
    if compiled is False:
        return False
    if type(compiled) is frozenset:
        return type(value) in compiled
    return compiled(value)  # type: ignore[operator]
