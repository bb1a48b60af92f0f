"""Run specs from YAML or dicts into sluice.v1.RunSpec, as `sluice submit` reads them.

This mirrors controller/spec_yaml.cc so that a spec means the same
thing whichever client sends it:

- field names are RunSpec's (proto names, or their camelCase JSON names);
- enum values by full proto name (``OBJECTIVE_GRPO``) or the short lower-case
  one (``grpo``; ``-`` may stand for ``_``);
- a repeated field also takes a single value, ``key:`` alone selects a message
  with its defaults, YAML's ``.inf``/``.nan`` are accepted for floats;
- YAML scalars are read as text and parsed by the field's type (as yaml-cpp
  does), so ``name: yes`` is the string "yes", not True;
- every problem is reported at once, one line each, naming the field (and the
  line, for YAML): ``spec.yaml:7: algorithm.group_size: expected an integer,
  got "four"``; an unknown field gets "did you mean".

Values are checked here only for type and range of their proto type; what is
a *valid run* (group_size >= 2, a model named, the memory estimate) is the
controller's to decide, and its INVALID_ARGUMENT message comes back through
:class:`sluice.client.SluiceError`.
"""

from __future__ import annotations

import math
import os
from typing import Any, Iterable, List, Mapping, Optional, Union

import yaml
from google.protobuf import descriptor as _descriptor
from google.protobuf import json_format

from sluice.errors import SpecError
from sluice.v1 import common_pb2

__all__ = ["SpecError", "closest_name", "load_run_spec", "parse_yaml", "to_message"]

FieldDescriptor = _descriptor.FieldDescriptor

_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)
_UINT32 = (0, 2**32 - 1)
_UINT64 = (0, 2**64 - 1)
_RANGES = {
    FieldDescriptor.CPPTYPE_INT32: _INT32,
    FieldDescriptor.CPPTYPE_INT64: _INT64,
    FieldDescriptor.CPPTYPE_UINT32: _UINT32,
    FieldDescriptor.CPPTYPE_UINT64: _UINT64,
}


class _Text(str):
    """A YAML scalar as text, remembering its (1-based) line."""

    line: Optional[int] = None


class _SpecLoader(yaml.SafeLoader):
    """SafeLoader that keeps every scalar as text (except null) and its line."""


# Only null and merge keys are resolved implicitly; booleans, numbers and
# timestamps stay text and are parsed by the proto field's type, as yaml-cpp's
# Scalar() does for the C++ reader.
_SpecLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers
            if tag in ("tag:yaml.org,2002:null", "tag:yaml.org,2002:merge")]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _construct_text(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> _Text:
    text = _Text(loader.construct_scalar(node))
    text.line = node.start_mark.line + 1
    return text


class _List(list):
    line: Optional[int] = None


class _Dict(dict):
    line: Optional[int] = None


def _construct_list(loader: yaml.SafeLoader, node: yaml.SequenceNode):
    data = _List()
    data.line = node.start_mark.line + 1
    yield data
    data.extend(loader.construct_sequence(node))


def _construct_dict(loader: yaml.SafeLoader, node: yaml.MappingNode):
    data = _Dict()
    data.line = node.start_mark.line + 1
    yield data
    data.update(loader.construct_mapping(node))


_SpecLoader.add_constructor("tag:yaml.org,2002:str", _construct_text)
_SpecLoader.add_constructor("tag:yaml.org,2002:seq", _construct_list)
_SpecLoader.add_constructor("tag:yaml.org,2002:map", _construct_dict)
# Explicitly tagged scalars (!!int 3, !!bool true) are text too.
for _tag in ("bool", "int", "float", "timestamp", "binary"):
    _SpecLoader.add_constructor("tag:yaml.org,2002:" + _tag, _construct_text)


def _edit_distance(a: str, b: str) -> int:
    row = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        diagonal, row[0] = row[0], i
        for j in range(1, len(b) + 1):
            above = row[j]
            row[j] = min(row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1]))
            diagonal = above
    return row[len(b)]


def closest_name(name: str, candidates: Iterable[str]) -> Optional[str]:
    """The candidate nearest to `name` by edit distance, if near enough (as the CLI)."""
    best, best_distance = None, None
    for candidate in candidates:
        distance = _edit_distance(name, candidate)
        if best_distance is None or distance < best_distance:
            best, best_distance = candidate, distance
    if best is None or best_distance > max(2, len(name) // 3):
        return None
    return best


def _enum_prefix(enum_type: _descriptor.EnumDescriptor) -> str:
    names = [value.name for value in enum_type.values]
    if len(names) < 2:
        return ""
    prefix = os.path.commonprefix(names)
    underscore = prefix.rfind("_")
    return "" if underscore < 0 else prefix[: underscore + 1]


def _kind(value: Any) -> str:
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, (list, tuple)):
        return "a list"
    if value is None:
        return "nothing"
    return '"%s"' % (value,)


def _expected(field: FieldDescriptor) -> str:
    cpp = field.cpp_type
    if cpp == FieldDescriptor.CPPTYPE_STRING:
        return "a string"
    if cpp == FieldDescriptor.CPPTYPE_BOOL:
        return "true or false"
    if cpp in (FieldDescriptor.CPPTYPE_INT32, FieldDescriptor.CPPTYPE_INT64):
        return "an integer"
    if cpp in (FieldDescriptor.CPPTYPE_UINT32, FieldDescriptor.CPPTYPE_UINT64):
        return "a non-negative integer"
    if cpp in (FieldDescriptor.CPPTYPE_FLOAT, FieldDescriptor.CPPTYPE_DOUBLE):
        return "a number"
    if cpp == FieldDescriptor.CPPTYPE_ENUM:
        return "a %s value" % field.enum_type.name
    return "a mapping of %s fields" % field.message_type.name


_INVALID = object()


class _Converter:
    """Walks a spec (dicts, lists, scalars) along a message descriptor into
    proto-JSON, collecting every problem instead of stopping at the first."""

    def __init__(self, source: str):
        self.source = source
        self.errors: List[str] = []

    def _error_line(self, line: Optional[int], message: str) -> None:
        where = self.source if line is None else "%s:%d" % (self.source, line)
        self.errors.append("%s: %s" % (where, message))

    def _error(self, line: Optional[int], path: str, problem: str) -> None:
        self._error_line(line, "%s: %s" % (path, problem))

    @staticmethod
    def _line(value: Any, fallback: Optional[int]) -> Optional[int]:
        return getattr(value, "line", None) or fallback

    def message(self, value: Any, message_type: _descriptor.Descriptor, path: str,
                line: Optional[int]) -> dict:
        out: dict = {}
        if value is None:
            return out
        where = path or "the run spec"
        if not isinstance(value, Mapping):
            self._error(self._line(value, line), where, "expected a mapping of %s fields, got %s"
                        % (message_type.name, _kind(value)))
            return out
        by_json_name = {field.json_name: field for field in message_type.fields}
        seen = set()
        oneofs_seen = set()
        for key, item in value.items():
            key_line = self._line(key, line)
            if not isinstance(key, str):
                self._error(key_line, where, "field names must be plain strings")
                continue
            field = message_type.fields_by_name.get(key) or by_json_name.get(key)
            if field is None:
                self._unknown_field(key_line, key, message_type, where)
                continue
            field_path = field.name if not path else path + "." + field.name
            if field.name in seen:
                self._error(key_line, field_path, "given more than once")
                continue
            seen.add(field.name)
            if not self._check_oneof(key_line, field, where, oneofs_seen):
                continue
            if item is None:
                # `arithmetic:` alone selects the message with its defaults; a
                # null scalar or list is simply unset.
                if (field.cpp_type == FieldDescriptor.CPPTYPE_MESSAGE
                        and field.label != FieldDescriptor.LABEL_REPEATED):
                    out[field.name] = {}
                continue
            converted = self._field(item, field, field_path, key_line)
            if converted is not _INVALID:
                out[field.name] = converted
        return out

    def _check_oneof(self, line, field, where, oneofs_seen) -> bool:
        oneof = field.containing_oneof
        # proto3 `optional` fields sit in a synthetic one-member oneof.
        if oneof is None or len(oneof.fields) < 2 or oneof.name.startswith("_"):
            return True
        if oneof.full_name not in oneofs_seen:
            oneofs_seen.add(oneof.full_name)
            return True
        self._error(line, where, "only one of %s may be set"
                    % " or ".join(member.name for member in oneof.fields))
        return False

    def _unknown_field(self, line, name, message_type, where) -> None:
        known = [field.name for field in message_type.fields]
        best = closest_name(name, known)
        if best is not None:
            self._error_line(line, 'unknown field "%s" in %s; did you mean "%s"?'
                             % (name, where, best))
        else:
            self._error_line(line, 'unknown field "%s" in %s; known fields: %s'
                             % (name, where, ", ".join(known)))

    def _field(self, value, field, path, line):
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            if not isinstance(value, Mapping):
                self._error(self._line(value, line), path,
                            "expected a mapping, got %s" % _kind(value))
                return _INVALID
            key_field = field.message_type.fields_by_name["key"]
            value_field = field.message_type.fields_by_name["value"]
            out = {}
            for key, item in value.items():
                entry_path = '%s["%s"]' % (path, key)
                entry_line = self._line(key, line)
                if isinstance(key, (Mapping, list, tuple)) or key is None:
                    self._error(entry_line, path, "map keys must be scalars")
                    continue
                converted_key = self._singular(key, key_field, entry_path, entry_line)
                converted_value = self._singular(item, value_field, entry_path, entry_line)
                if converted_key is _INVALID or converted_value is _INVALID:
                    continue
                out[converted_key if isinstance(converted_key, str)
                    else str(converted_key).lower()] = converted_value
            return out
        if field.label == FieldDescriptor.LABEL_REPEATED:
            items = value if isinstance(value, (list, tuple)) else [value]
            out = []
            for index, item in enumerate(items):
                converted = self._singular(item, field, "%s[%d]" % (path, index), line)
                if converted is not _INVALID:
                    out.append(converted)
            return out
        return self._singular(value, field, path, line)

    def _singular(self, value, field, path, line):
        cpp = field.cpp_type
        if cpp == FieldDescriptor.CPPTYPE_MESSAGE:
            return self.message(value, field.message_type, path, line)
        line = self._line(value, line)
        if isinstance(value, (Mapping, list, tuple)) or value is None:
            self._error(line, path, "expected %s, got %s" % (_expected(field), _kind(value)))
            return _INVALID

        def bad():
            self._error(line, path, 'expected %s, got "%s"' % (_expected(field), value))
            return _INVALID

        if cpp == FieldDescriptor.CPPTYPE_STRING:
            if isinstance(value, str):
                return str(value)
            # A dict from yaml.safe_load has `name: 123` as an int; the text is meant.
            if isinstance(value, int) and not isinstance(value, bool):
                return str(value)
            return bad()
        if cpp == FieldDescriptor.CPPTYPE_BOOL:
            if isinstance(value, bool):
                return value
            if isinstance(value, str):
                lower = value.lower()
                if lower in ("true", "yes", "on"):
                    return True
                if lower in ("false", "no", "off"):
                    return False
            return bad()
        if cpp in _RANGES:
            if isinstance(value, bool):
                return bad()
            if isinstance(value, int):
                number = value
            elif isinstance(value, str):
                try:
                    number = int(value.strip(), 10)
                except ValueError:
                    return bad()
            else:
                return bad()
            low, high = _RANGES[cpp]
            if number < low or number > high:
                if low == 0 and number < 0:
                    return bad()
                self._error(line, path, "value %s is out of range for a %d-bit integer"
                            % (value, 32 if high < 2**32 else 64))
                return _INVALID
            return number
        if cpp in (FieldDescriptor.CPPTYPE_FLOAT, FieldDescriptor.CPPTYPE_DOUBLE):
            if isinstance(value, bool):
                return bad()
            if isinstance(value, (int, float)):
                number = float(value)
            elif isinstance(value, str):
                # YAML spells the specials .inf, -.inf and .nan; proto JSON
                # wants "Infinity", "-Infinity" and "NaN".
                lower = value.strip().lower()
                if lower in (".inf", "+.inf", "inf"):
                    return "Infinity"
                if lower in ("-.inf", "-inf"):
                    return "-Infinity"
                if lower in (".nan", "nan"):
                    return "NaN"
                try:
                    number = float(lower)
                except ValueError:
                    return bad()
                if not math.isfinite(number):
                    return bad()
                return number
            else:
                return bad()
            if math.isnan(number):
                return "NaN"
            if math.isinf(number):
                return "Infinity" if number > 0 else "-Infinity"
            return number
        if cpp == FieldDescriptor.CPPTYPE_ENUM:
            return self._enum(value, field.enum_type, path, line)
        return bad()

    def _enum(self, value, enum_type, path, line):
        if isinstance(value, int) and not isinstance(value, bool):
            if value in enum_type.values_by_number:
                return enum_type.values_by_number[value].name
        elif isinstance(value, str):
            prefix = _enum_prefix(enum_type)
            upper = value.upper().replace("-", "_")
            for candidate in (value, upper, prefix + upper):
                if candidate in enum_type.values_by_name:
                    return candidate
        prefix = _enum_prefix(enum_type)
        names = [v.name[len(prefix):].lower() for v in enum_type.values
                 if not v.name.endswith("_UNSPECIFIED")]
        example = enum_type.values[1 if len(enum_type.values) > 1 else 0].name
        self._error(line, path, 'unknown value "%s"; expected one of %s (or the full name, '
                    'e.g. %s)' % (value, ", ".join(names), example))
        return _INVALID


def to_message(value: Any, message_class, source: str = "spec"):
    """Converts a dict (or YAML-loaded tree) into a new `message_class` message.

    Raises SpecError listing every problem.
    """
    converter = _Converter(source)
    document = converter.message(value, message_class.DESCRIPTOR, "", None)
    if converter.errors:
        raise SpecError(converter.errors)
    message = message_class()
    try:
        json_format.ParseDict(document, message, ignore_unknown_fields=False)
    except json_format.ParseError as error:
        raise SpecError(["%s: %s" % (source, error)]) from None
    return message


def parse_yaml(text: str, source: str = "spec"):
    """Parses YAML text into the loader's tree (text scalars with lines).

    Raises SpecError on invalid YAML, naming line and column.
    """
    try:
        return yaml.load(text, Loader=_SpecLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        where = source if mark is None else "%s:%d:%d" % (source, mark.line + 1, mark.column + 1)
        problem = error.problem or error.context or str(error)
        raise SpecError(["%s: invalid YAML: %s" % (where, problem)]) from None
    except yaml.YAMLError as error:
        raise SpecError(["%s: invalid YAML: %s" % (source, error)]) from None


SpecLike = Union[str, "os.PathLike[str]", Mapping[str, Any], common_pb2.RunSpec]


def load_run_spec(spec: SpecLike) -> common_pb2.RunSpec:
    """A RunSpec from a RunSpec, a dict, a YAML file path or YAML text.

    A string naming an existing file (or ending in .yaml/.yml/.json) is read
    as a file; any other string is YAML text. Raises SpecError for a spec
    that cannot be read (a missing .yaml file included).
    """
    if isinstance(spec, common_pb2.RunSpec):
        copy = common_pb2.RunSpec()
        copy.CopyFrom(spec)
        return copy
    if isinstance(spec, Mapping):
        return to_message(spec, common_pb2.RunSpec, "spec")
    if isinstance(spec, os.PathLike) or (
            isinstance(spec, str) and "\n" not in spec
            and (os.path.isfile(spec) or spec.endswith((".yaml", ".yml", ".json")))):
        path = os.fspath(spec)
        try:
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
        except OSError as error:
            raise SpecError(["%s: cannot read: %s" % (path, error.strerror or error)]) from None
        return to_message(parse_yaml(text, path), common_pb2.RunSpec, path)
    if isinstance(spec, str):
        return to_message(parse_yaml(spec, "spec"), common_pb2.RunSpec, "spec")
    raise TypeError("a run spec is a YAML path, YAML text, a dict or a RunSpec, not %s"
                    % type(spec).__name__)
