"""Row documents stored compactly: the record's fields that its table's columns do not already
hold, without default values, as MessagePack.

Why: a lead is written to the WAL at its commit, to the database file at the next checkpoint,
and synced twice; per submit that writing cost about as much CPU as the rest of the write. As
JSON with every field, a typical lead row (~2.3 KB) took a 4 KB page alone and a submission
(~1.8 KB) half of one; packed, two leads and three submissions share a page (bench/HISTORY.md).

Rows written before, and records MessagePack cannot carry (integers beyond 64 bits, which JSON
bodies may hold), are the whole record as JSON: `unpack` and `json_of` tell them by their first
byte, `{`, which no packed document starts with (MessagePack maps start with 0x80-0x8f or
0xde-0xdf). The API serves documents as JSON either way. SQL's JSON functions cannot read packed
documents: a migration that needs a field of them reads the rows in Python. A field's default is
part of the format (omitted values read back as today's default), so changing a default needs a
migration that writes the old one into the rows that omitted it."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any, Generic, TypeVar

import msgspec

R = TypeVar("R", bound=msgspec.Struct)

_to_json = msgspec.json.Encoder().encode
_to_msgpack = msgspec.msgpack.Encoder().encode


class PackedDocs(Generic[R]):
    """The document codec of one table whose rows hold a `record_type` record.

    `columns` are the record's fields that the table's own columns hold, in the order the reads
    select them (before the document); boolean fields come back from SQLite as 0 or 1."""

    def __init__(self, record_type: type[R], columns: Sequence[str]) -> None:
        fields = msgspec.structs.fields(record_type)
        names = {field.name for field in fields}
        unknown = [name for name in columns if name not in names]
        if unknown:
            raise ValueError(f"{record_type.__name__} has no field {unknown[0]}")
        # Required fields first: the packed struct is built positionally, and a required field
        # may not follow one with a default there (the record types are keyword-only).
        kept_positions = sorted((i for i, field in enumerate(fields) if field.name not in columns),
                                key=lambda i: not fields[i].required)
        kept = [fields[i] for i in kept_positions]
        self._record_type = record_type
        self._columns = tuple(columns)
        self._booleans = frozenset(field.name for field in fields if field.type is bool and field.name in columns)
        self._kept_names = tuple(field.name for field in kept)
        # Built positionally from the record's values: half the cost of keywords on the submit path.
        self._kept_values = operator.itemgetter(*kept_positions) if len(kept_positions) > 1 \
            else lambda values: (values[kept_positions[0]],)
        self._stored_type = msgspec.defstruct(
            f"Packed{record_type.__name__}",
            [(field.name, field.type, _default(field)) for field in kept],
            omit_defaults=True, rename="camel",
        )
        self._from_msgpack = msgspec.msgpack.Decoder(self._stored_type).decode
        self._from_json = msgspec.json.Decoder(record_type).decode

    @property
    def columns(self) -> tuple[str, ...]:
        return self._columns

    def pack(self, record: R) -> bytes:
        try:
            return _to_msgpack(self._stored_type(*self._kept_values(msgspec.structs.astuple(record))))
        except OverflowError:
            return _to_json(record)

    def unpack(self, row: Sequence[Any]) -> R:
        """A record from a row of (*columns, doc)."""
        doc = row[-1]
        if doc[:1] == b"{":
            return self._from_json(doc)
        stored = msgspec.structs.astuple(self._from_msgpack(doc))
        fields = dict(zip(self._kept_names, stored))
        for name, value in zip(self._columns, row):
            fields[name] = bool(value) if name in self._booleans else value
        return self._record_type(**fields)

    def json_of(self, row: Sequence[Any]) -> bytes:
        """The record as the API returns it, from a row of (*columns, doc)."""
        doc = row[-1]
        return doc if doc[:1] == b"{" else _to_json(self.unpack(row))


def _default(field: msgspec.structs.FieldInfo) -> Any:
    if field.default_factory is not msgspec.NODEFAULT:
        return msgspec.field(default_factory=field.default_factory)
    return field.default
