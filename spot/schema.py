"""Typed checks of the fields of the files spot reads (manifest.json, drafter.json, config.json, tuning records, prompt
files, trace files), made once when a file is read: each field's JSON type and range, so that a wrong type or a number
out of range is one SpotError naming the file, the field and the value ("got X, expected Y"), never a TypeError deep
in the runtime nor an allocation sized by an edited number.

A format's table of fields lives beside its reader (spot.config.MODEL_SECTION, spot.folder.manifest.MANIFEST, ...);
the C++ host checks the same fields with the same bounds (cpp/src/bounds.h; docs/exported-folder.md lists them).
"""
from __future__ import annotations

import math
import re
import reprlib
from dataclasses import dataclass

from spot.errors import SpotError

_SHOWN = reprlib.Repr()
_SHOWN.maxstring, _SHOWN.maxother, _SHOWN.maxlist, _SHOWN.maxdict, _SHOWN.maxlevel = 60, 60, 4, 4, 2


def shown(value) -> str:
    """A short repr of a value read from a file (a long string, a long list or a deep one cut with ...)."""
    return _SHOWN.repr(value)


class Mismatch(Exception):
    """A value that is not what its field expects. where: the field's path in the file ("model.vocab_size",
    "files.config.json.bytes", "[3]"); missing: the field is absent; key: the value is a key of a map (a file name
    of "files") that its key field refuses."""

    def __init__(self, where: str, value, expected: str, missing: bool = False, key: bool = False):
        super().__init__(where)
        self.where, self.value, self.expected, self.missing, self.key = where, value, expected, missing, key

    def inside(self, key: str) -> "Mismatch":
        """This mismatch, found in the value of `key` (an object's key, or "[i]" of a list)."""
        where = key if not self.where else f"{key}{self.where}" if self.where.startswith("[") else \
            f"{key}.{self.where}"
        return Mismatch(where, self.value, self.expected, self.missing, self.key)

    def message(self, what: str) -> str:
        if self.missing:
            return f"{what} lacks field {self.where!r}"
        if self.key:        # a key of a map (a file name of "files")
            return f"{what}: {self.where} lists {shown(self.value)}, expected {self.expected}"
        return f"{what}: {self.where or 'the value'} is {shown(self.value)}, expected {self.expected}"


class Field:
    """One field's type and range: check(value) returns the value, or raises Mismatch."""

    expected = "a value"

    def check(self, value):
        return value

    def refuse(self, value):
        raise Mismatch("", value, self.expected)


ANY = Field()


@dataclass(frozen=True)
class Integer(Field):
    """A JSON integer (written without a fraction or exponent; not true / false) in lo..hi."""

    lo: int
    hi: int

    @property
    def expected(self) -> str:
        return f"an integer in {self.lo}..{self.hi}"

    def check(self, value):
        if isinstance(value, bool) or not isinstance(value, int) or not self.lo <= value <= self.hi:
            self.refuse(value)
        return value


@dataclass(frozen=True)
class Number(Field):
    """A finite JSON number (an integer too) in the interval lo..hi, each end open or closed."""

    lo: float = -math.inf
    hi: float = math.inf
    lo_open: bool = False
    hi_open: bool = False

    @property
    def expected(self) -> str:
        if math.isinf(self.hi):
            return "a finite number" if math.isinf(self.lo) else f"a number {'>' if self.lo_open else '>='} {self.lo:g}"
        return (f"a number in {'(' if self.lo_open else '['}{self.lo:g}, {self.hi:g}"
                f"{')' if self.hi_open else ']'}")

    def check(self, value):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            self.refuse(value)
        above = value > self.lo if self.lo_open else value >= self.lo
        below = value < self.hi if self.hi_open else value <= self.hi
        if not (above and below):
            self.refuse(value)
        return value


@dataclass(frozen=True)
class Boolean(Field):
    expected = "true or false"

    def check(self, value):
        if not isinstance(value, bool):
            self.refuse(value)
        return value


@dataclass(frozen=True)
class Text(Field):
    """A JSON string: one of `choices` when given, matching `pattern` (whole) when given; `what` names it."""

    choices: tuple[str, ...] = ()
    pattern: str | None = None
    what: str = "a string"

    @property
    def expected(self) -> str:
        return f"one of {', '.join(self.choices)}" if self.choices else self.what

    def check(self, value):
        if (not isinstance(value, str) or (self.choices and value not in self.choices)
                or (self.pattern is not None and re.fullmatch(self.pattern, value) is None)):
            self.refuse(value)
        return value


SHA256 = Text(pattern="[0-9a-f]{64}", what="a sha256 (64 lowercase hex digits)")


@dataclass(frozen=True)
class Satisfies(Field):
    """A JSON string for which `test` holds; `what` says what that is."""

    test: object
    what: str

    @property
    def expected(self) -> str:
        return self.what

    def check(self, value):
        if not isinstance(value, str) or not self.test(value):
            self.refuse(value)
        return value


@dataclass(frozen=True)
class ListOf(Field):
    """A JSON array of at most max_len items, each checked by `item`."""

    item: Field
    max_len: int

    @property
    def expected(self) -> str:
        return f"a list of at most {self.max_len} items, each {self.item.expected}"

    def check(self, value):
        if not isinstance(value, list) or len(value) > self.max_len:
            self.refuse(value)
        for i, x in enumerate(value):
            try:
                self.item.check(x)
            except Mismatch as e:
                raise e.inside(f"[{i}]") from None
        return value


@dataclass(frozen=True)
class Nullable(Field):
    """null, or what `inner` takes."""

    inner: Field

    @property
    def expected(self) -> str:
        return f"null or {self.inner.expected}"

    def check(self, value):
        if value is None:
            return value
        try:
            return self.inner.check(value)
        except Mismatch as e:
            if e.where:     # inside the value: that field's own mismatch
                raise
            self.refuse(value)


@dataclass(frozen=True)
class AnyOf(Field):
    """What one of `options` takes."""

    options: tuple[Field, ...]

    @property
    def expected(self) -> str:
        return " or ".join(o.expected for o in self.options)

    def check(self, value):
        for option in self.options:
            try:
                return option.check(value)
            except Mismatch:
                pass
        self.refuse(value)


@dataclass(frozen=True)
class Record(Field):
    """A JSON object with known fields: those of `required` present, each known one checked by its Field; any other
    key checked by `others` (None: refused, a closed record)."""

    fields: dict[str, Field]
    required: tuple[str, ...] = ()
    others: Field | None = ANY
    what: str = "an object"

    @property
    def expected(self) -> str:
        return self.what

    def check(self, value):
        if not isinstance(value, dict):
            self.refuse(value)
        for key in self.required:
            if key not in value:
                raise Mismatch(key, None, "", missing=True)
        for key, x in value.items():
            rule = self.fields.get(key, self.others)
            if rule is None:
                raise Mismatch(key, x, f"no such field (the fields of {self.what}: {', '.join(self.fields)})")
            try:
                rule.check(x)
            except Mismatch as e:
                raise e.inside(key) from None
        return value


@dataclass(frozen=True)
class MapOf(Field):
    """A JSON object, its keys checked by `key`, its values by `value`."""

    key: Field
    value: Field
    what: str = "an object"

    @property
    def expected(self) -> str:
        return self.what

    def check(self, value):
        if not isinstance(value, dict):
            self.refuse(value)
        for k, x in value.items():
            try:
                self.key.check(k)
            except Mismatch as e:
                raise Mismatch("", k, e.expected, key=True) from None
            try:
                self.value.check(x)
            except Mismatch as e:
                raise e.inside(k) from None
        return value


def rule(ok: bool, where: str, value, expected: str) -> None:
    """A rule across fields (a mask id inside the vocabulary, max_context within the positions): Mismatch naming
    `where` unless ok."""
    if not ok:
        raise Mismatch(where, value, expected)


def checked(value, schema: Field, what: str, remedy: str):
    """`value` when `schema` takes it; SpotError naming `what` (the file), the field, the value and what was expected
    otherwise, with `remedy` as the hint."""
    try:
        return schema.check(value)
    except Mismatch as e:
        raise SpotError(e.message(what), remedy) from None
