"""SPEC §8: which lines and rows belong to an erased key, known only by its salted hash.

The lake never stores an erased key: the `erasures` table keeps `SHA-256(salt + key)` (hex),
with one salt per lake. A value is erased when its hash is one of those, so every check here
is a Spark expression over hashes, and a check needs only the hashes and the salt, never the
keys (a second `sessionize forget` finishes the first from its hashes).

The salt is stored beside the hashes: it does not make a hash secret from someone who can read
the lake and guess keys (a known user id hashes to its row), it keeps the hashes from matching
those of the same keys in any other system, or a precomputed table.
"""

from __future__ import annotations

import hashlib
import operator
import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import reduce

from pyspark.sql import Column
from pyspark.sql import functions as F

# A JSON string in a line's text, its content unescaped as sent (group 1). The loop is
# unrolled with possessive quantifiers: Java's regex engine recurses once per repetition of an
# alternation, which overflows its stack on a long line.
JSON_STRING = r'"([^"\\]*+(?:\\.[^"\\]*+)*+)"'
# The same in Python's engine: Java's `.` matches no line terminator (LF, CR, NEL, LS, PS).
_JSON_STRING_ON_DRIVER = re.compile(JSON_STRING.replace("\\\\.", "\\\\[^\n\r\u0085\u2028\u2029]"))


def key_hash(*, salt: str, key: str) -> str:
    """The hash the `erasures` table stores for `key`: SHA-256 of the salt and the key's UTF-8
    bytes, in hex (what Spark's `sha2(concat(salt, key), 256)` gives)."""
    return hashlib.sha256((salt + key).encode()).hexdigest()


@dataclass(frozen=True, kw_only=True)
class ErasedKeys:
    """The lake's salt and the hashes of every key erased so far."""

    salt: str
    hashes: frozenset[str]

    def hash_of(self, key: str) -> str:
        return key_hash(salt=self.salt, key=key)

    def holds(self, key: str | None) -> bool:
        """Whether `key` (a value as the lake holds it) is erased; None is not."""
        return key is not None and self.hash_of(key) in self.hashes

    def value_is_erased(self, column: str | Column) -> Column:
        """Whether the column's value is an erased key (never null: a null value is not)."""
        if not self.hashes:
            return F.lit(False)
        hashed = F.sha2(
            F.concat(F.lit(self.salt), F.col(column) if isinstance(column, str) else column), 256
        )
        return F.coalesce(hashed.isin(sorted(self.hashes)), F.lit(False))

    def any_is_erased(self, columns: Iterable[str]) -> Column:
        """Whether one of `columns` holds an erased key."""
        return reduce(operator.or_, (self.value_is_erased(column) for column in columns))

    def text_holds(self, text: str) -> bool:
        """`text_holds_erased` of one text, on the driver."""
        return any(self.holds(key) for key in _JSON_STRING_ON_DRIVER.findall(text))

    def text_holds_erased(self, column: str) -> Column:
        """Whether the text holds an erased key as a JSON string (a whole string: `"KEY"`)."""
        if not self.hashes:
            return F.lit(False)
        strings = F.regexp_extract_all(F.col(column), F.lit(JSON_STRING), F.lit(1))
        return F.coalesce(F.exists(strings, self.value_is_erased), F.lit(False))
