"""Where the lake's tables live: a local folder, or a URI of an object store.

A `Location` names a table, or a file in it, the way Spark and delta-rs both take it: a local
absolute path, or the URI itself (`s3a://bucket/lake/events`). The driver reads the few files
it reads itself (commit files, small tables) through pyarrow's file system for the scheme, so
nothing on the driver assumes a POSIX file system. Credentials and endpoints come from the
environment every engine reads (`AWS_ACCESS_KEY_ID`, `AWS_ENDPOINT_URL`, ...;
docs/storage.md, Object storage).

Spark names S3 `s3a://` (Hadoop's connector); delta-rs takes `s3a://` and `s3://` alike, and
pyarrow only `s3://`, which is what `filesystem` hands it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from urllib.parse import urlparse

import pyarrow.fs as pafs

# Schemes that name the same store under another name for pyarrow.
_PYARROW_SCHEMES = {"s3a": "s3", "s3n": "s3"}


@dataclass(frozen=True)
class Location:
    """A table's folder, or a file in it: a local absolute path or an object-store URI."""

    uri: str

    @classmethod
    def of(cls, where: str | Path | Location) -> Location:
        """`where` as a location: a URI stays as it is (less a trailing slash), and a local
        path (or a `file:` URI) becomes absolute."""
        if isinstance(where, Location):
            return where
        text = str(where)
        scheme = urlparse(text).scheme
        if scheme == "file":
            return cls(str(Path(urlparse(text).path).absolute()))
        if scheme:
            return cls(text.rstrip("/"))
        return cls(str(Path(text).absolute()))

    @property
    def is_local(self) -> bool:
        return "://" not in self.uri

    @property
    def scheme(self) -> str:
        return urlparse(self.uri).scheme if not self.is_local else "file"

    def __str__(self) -> str:
        return self.uri

    def __truediv__(self, relative: str) -> Location:
        return Location(f"{self.uri}/{relative.strip('/')}")

    @property
    def name(self) -> str:
        return self.uri.rsplit("/", 1)[-1]

    def local_path(self) -> Path:
        """This location as a local path; a `ValueError` for an object store."""
        if not self.is_local:
            raise ValueError(f"{self.uri} is not on the local file system")
        return Path(self.uri)

    def as_uri(self) -> str:
        """A URI for links and metadata (`file:///...` for a local folder)."""
        return Path(self.uri).as_uri() if self.is_local else self.uri

    def filesystem(self) -> tuple[pafs.FileSystem, str]:
        """pyarrow's file system for this location and the location's path in it."""
        if self.is_local:
            return _local(), self.uri
        parsed = urlparse(self.uri)
        scheme = _PYARROW_SCHEMES.get(parsed.scheme, parsed.scheme)
        return _filesystem(f"{scheme}://{parsed.netloc}"), f"{parsed.netloc}{parsed.path}"

    def exists(self) -> bool:
        filesystem, path = self.filesystem()
        return filesystem.get_file_info(path).type != pafs.FileType.NotFound

    def read_text(self) -> str:
        """The file's text; `FileNotFoundError` when there is none."""
        filesystem, path = self.filesystem()
        try:
            with filesystem.open_input_stream(path) as stream:
                return stream.read().decode()
        except FileNotFoundError:
            raise
        except OSError as exc:  # pyarrow's object stores say "not found" in an OSError
            if "not found" in str(exc).lower() or "no such" in str(exc).lower():
                raise FileNotFoundError(self.uri) from exc
            raise


@lru_cache(maxsize=1)
def _local() -> pafs.FileSystem:
    return pafs.LocalFileSystem()


@lru_cache(maxsize=16)
def _filesystem(root: str) -> pafs.FileSystem:
    """One pyarrow file system per bucket, configured from the environment."""
    filesystem, _ = pafs.FileSystem.from_uri(root)
    return filesystem
