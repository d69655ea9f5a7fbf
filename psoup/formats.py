"""The input file formats of `psoup ingest` and `psoup archive import`, in one table.

A format is named `csv`, `jsonl` (one JSON object per line; `json` and `ndjson` are
accepted for it) or `parquet`, and is guessed from a file's extension, looking through a
compression suffix (`traffic.csv.gz` is CSV). CSV and JSON lines may be compressed with
gzip, bzip2 or Zstandard (`.gz`, `.bz2`, `.zst`): ingest decompresses them in Python and
Arrow, archive import with Spark's Hadoop codecs, which read the same three. Other
compression suffixes, and a compressed Parquet file (Parquet compresses its pages
itself), are refused by `input_format` with the reason.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, get_args

#: An input format, by its canonical name (`--format` also takes ALIASES).
InputFormat = Literal["csv", "jsonl", "parquet"]

#: A compression codec both readers decompress.
Codec = Literal["gzip", "bz2", "zstd"]

#: The input formats.
FORMATS: tuple[InputFormat, ...] = get_args(InputFormat)

#: Other names a user may give a format.
ALIASES: dict[str, InputFormat] = {"json": "jsonl", "ndjson": "jsonl"}

#: File extensions and the formats they imply.
EXTENSIONS: dict[str, InputFormat] = {
    ".csv": "csv", ".tsv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl",
    ".parquet": "parquet", ".pq": "parquet"}

#: Seconds per unit of a numeric timestamp (`psoup ingest --ts-unit`).
TS_UNITS = {"s": 1.0, "ms": 1e3, "us": 1e6, "ns": 1e9}

#: Compression suffixes both readers decompress, and the codec each names.
COMPRESSIONS: dict[str, Codec] = {".gz": "gzip", ".bz2": "bz2", ".zst": "zstd"}

#: Compression suffixes recognised, but read by neither (Hadoop's .lz4 and .snappy are
#: its own block formats, not the lz4 and snappy tools' frames).
UNREADABLE = (".lz4", ".snappy", ".deflate", ".xz", ".br", ".zip")


def canonical(fmt: str) -> InputFormat:
    """A format name or alias as one of FORMATS.

    Raises:
        ValueError: a name that is none of them.

    Example:
        >>> canonical("json"), canonical("CSV")
        ('jsonl', 'csv')
    """
    name = fmt.lower()
    alias = ALIASES.get(name)
    if alias is not None:
        return alias
    for known in FORMATS:
        if name == known:
            return known
    raise ValueError(f"unknown format {fmt!r} (formats: {', '.join(FORMATS)})")


def guess_format(name: str | Path) -> InputFormat:
    """The format a file name implies ("-", standard input, is CSV).

    Raises:
        ValueError: an extension no format claims.

    Example:
        >>> guess_format("traffic.csv.gz"), guess_format("x.json"), guess_format("-")
        ('csv', 'jsonl', 'csv')
    """
    if str(name) == "-":
        return "csv"
    suffixes = [s.lower() for s in Path(name).suffixes]
    if suffixes and (suffixes[-1] in COMPRESSIONS or suffixes[-1] in UNREADABLE):
        suffixes.pop()
    fmt = EXTENSIONS.get(suffixes[-1]) if suffixes else None
    if fmt is None:
        raise ValueError(f"cannot tell the format of {str(name)!r} from its extension; pass "
                         f"--format ({', '.join(FORMATS)})")
    return fmt


def compression(name: str | Path) -> Codec | None:
    """The codec a file name's compression suffix names ("gzip", "bz2", "zstd"), or None
    for an uncompressed file ("-", standard input, is never compressed).

    Raises:
        ValueError: a compression neither reader can read.

    Example:
        >>> compression("traffic.csv.zst"), compression("traffic.csv"), compression("-")
        ('zstd', None, None)
    """
    if str(name) == "-":
        return None
    suffix = Path(name).suffix.lower()
    if suffix in UNREADABLE:
        raise ValueError(f"{str(name)!r}: {suffix} compression is not supported (use "
                         f"{', '.join(COMPRESSIONS)}, or decompress it first)")
    return COMPRESSIONS.get(suffix)


def input_format(name: str | Path, fmt: str | None = None
                 ) -> tuple[InputFormat, Codec | None]:
    """The format (`fmt`, a name or alias, else guessed from the name) and compression
    of an input file, the one check `psoup ingest` and `psoup archive import` share.

    Raises:
        ValueError: an unknown format or extension, a compression no reader reads, or a
            compressed Parquet file.

    Example:
        >>> input_format("a.ndjson.gz"), input_format("a.txt", "json")
        (('jsonl', 'gzip'), ('jsonl', None))
        >>> input_format("a.parquet.gz")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: 'a.parquet.gz': a Parquet file compresses its pages itself; ...
    """
    chosen = canonical(fmt) if fmt else guess_format(name)
    codec = compression(name)
    if chosen == "parquet" and codec is not None:
        raise ValueError(f"{str(name)!r}: a Parquet file compresses its pages itself; "
                         "compressing the whole file is not supported")
    return chosen, codec
