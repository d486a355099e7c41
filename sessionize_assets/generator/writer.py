"""Batch folders on disk: how a batch's lines are split into files, and writing them safely.

Why the care: the landing zone may be watched by the pipeline's sensor while it is written (for
example by `append_day` next to a running `dagster dev`). A new batch folder therefore appears
whole (written under a hidden name, then renamed), and a re-delivered one has each file replaced
atomically, as SPEC §1 describes re-deliveries.
"""

from __future__ import annotations

import gzip
import os
import random
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date
from itertools import pairwise
from pathlib import Path
from typing import BinaryIO

_BATCH = re.compile(r"^received_date=(\d{4}-\d{2}-\d{2})$")
_WRITE_BLOCK = 4096  # lines encoded at a time: bounded memory for any batch size


@dataclass(frozen=True, slots=True)
class FilePart:
    """One file of a batch: lines [start, end), an optional blank line inserted, gzip or not."""

    start: int
    end: int
    blank_at: int | None  # index in the part where a blank line is inserted
    trailing_blank: bool
    gzip: bool


def file_parts(rng: random.Random, n_lines: int, gzip_share: float) -> list[FilePart]:
    """Split a batch into 1-3 files, some gzip, some with blank lines, as exporters do."""
    n_files = max(1, min(n_lines, rng.choices((1, 2, 3), (55, 30, 15))[0]))
    cuts = sorted(rng.sample(range(1, n_lines), n_files - 1)) if n_files > 1 else []
    bounds = [0, *cuts, n_lines]
    parts: list[FilePart] = []
    for start, end in pairwise(bounds):
        size = end - start
        blank_at = rng.randrange(size + 1) if size and rng.random() < 0.25 else None
        trailing = bool(size) and rng.random() < 0.15
        use_gzip = bool(size) and rng.random() < gzip_share
        parts.append(FilePart(start, end, blank_at, trailing, use_gzip))
    if gzip_share > 0 and len(parts) >= 2 and not any(p.gzip for p in parts):
        last = parts[-1]
        parts[-1] = FilePart(last.start, last.end, last.blank_at, last.trailing_blank, True)
    return parts


def write_batch(folder: Path, lines: Sequence[str], parts: list[FilePart]) -> None:
    """Write the batch's files; a new folder appears whole, an existing one is re-delivered."""
    names = [f"part-{k:05d}.jsonl{'.gz' if p.gzip else ''}" for k, p in enumerate(parts)]
    if not folder.exists():
        staging = folder.with_name(f".{folder.name}.tmp")
        shutil.rmtree(staging, ignore_errors=True)  # left over by an interrupted run
        staging.mkdir(parents=True)
        for name, part in zip(names, parts, strict=True):
            _write_file(staging / name, lines, part)
        staging.rename(folder)
        return
    for name, part in zip(names, parts, strict=True):
        tmp = folder / f".{name}.tmp"
        _write_file(tmp, lines, part)
        os.replace(tmp, folder / name)
    for old in sorted(folder.iterdir()):
        if old.name not in names and old.name.endswith((".jsonl", ".jsonl.gz")):
            old.unlink()


def _write_file(path: Path, lines: Sequence[str], part: FilePart) -> None:
    with path.open("wb") as raw:
        if part.gzip:  # mtime=0 and no file name in the header: byte-identical reruns
            with gzip.GzipFile(
                filename="", mode="wb", fileobj=raw, compresslevel=6, mtime=0
            ) as packed:
                _write_lines(packed, lines, part)
        else:
            _write_lines(raw, lines, part)


def _write_lines(sink: BinaryIO | gzip.GzipFile, lines: Sequence[str], part: FilePart) -> None:
    """Each line followed by a newline, the part's blank lines included."""
    chunk = list(lines[part.start : part.end])
    if part.blank_at is not None:
        chunk.insert(part.blank_at, "")
    if part.trailing_blank:
        chunk.append(" \t")  # blank too: nothing but whitespace
    for i in range(0, len(chunk), _WRITE_BLOCK):
        text = "".join(f"{line}\n" for line in chunk[i : i + _WRITE_BLOCK])
        # surrogateescape: an invalid_encoding line carries its bytes as lone surrogates.
        sink.write(text.encode("utf-8", "surrogateescape"))


def count_lines(folder: Path) -> int:
    """Non-blank lines of a batch folder's files, as the pipeline counts them."""
    total = 0
    for path in sorted(folder.iterdir()):
        if path.name.endswith(".jsonl.gz"):
            with gzip.open(path, "rb") as packed:
                total += sum(1 for line in packed if line.strip())
        elif path.name.endswith(".jsonl"):
            with path.open("rb") as plain:
                total += sum(1 for line in plain if line.strip())
    return total


def batch_name(day: date) -> str:
    return f"received_date={day.isoformat()}"


def existing_batches(out: Path) -> list[date]:
    """Received days that have a batch folder under `out`, oldest first."""
    if not out.is_dir():
        return []
    return sorted(
        date.fromisoformat(m.group(1))
        for p in out.iterdir()
        if p.is_dir() and (m := _BATCH.match(p.name))
    )


def refuse_foreign_batches(out: Path, days: Sequence[date]) -> None:
    """Batch folders outside the generated range would silently change the expected counts."""
    wanted = set(days)
    foreign = [d for d in existing_batches(out) if d not in wanted]
    if foreign:
        shown = ", ".join(batch_name(d) for d in foreign[:3])
        raise FileExistsError(
            f"{out} already holds batches outside the generated range ({shown}"
            f"{', ...' if len(foreign) > 3 else ''}); use an empty folder"
        )
