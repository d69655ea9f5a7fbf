"""The input file formats of `psoup ingest` and `psoup archive import`, in one table.

A format is named `csv`, `jsonl` (one JSON object per line; `json` is accepted for it) or
`parquet`, and is guessed from a file's extension, looking through a compression suffix
(`traffic.csv.gz` is CSV).
"""

from __future__ import annotations

from pathlib import Path

#: The input formats.
FORMATS = ("csv", "jsonl", "parquet")

#: Other names a user may give a format.
ALIASES = {"json": "jsonl", "ndjson": "jsonl"}

#: File extensions and the formats they imply.
EXTENSIONS = {".csv": "csv", ".tsv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl",
              ".json": "jsonl", ".parquet": "parquet", ".pq": "parquet"}

#: Seconds per unit of a numeric timestamp (`psoup ingest --ts-unit`).
TS_UNITS = {"s": 1.0, "ms": 1e3, "us": 1e6, "ns": 1e9}

#: Compression suffixes looked through when guessing.
COMPRESSIONS = (".gz", ".bz2", ".zst", ".lz4", ".snappy", ".deflate")


def canonical(fmt: str) -> str:
    """A format name or alias as one of FORMATS.

    Raises:
        ValueError: a name that is none of them.

    Example:
        >>> canonical("json"), canonical("CSV")
        ('jsonl', 'csv')
    """
    name = ALIASES.get(fmt.lower(), fmt.lower())
    if name not in FORMATS:
        raise ValueError(f"unknown format {fmt!r} (formats: {', '.join(FORMATS)})")
    return name


def guess_format(name: str | Path) -> str:
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
    if suffixes and suffixes[-1] in COMPRESSIONS:
        suffixes.pop()
    fmt = EXTENSIONS.get(suffixes[-1]) if suffixes else None
    if fmt is None:
        raise ValueError(f"cannot tell the format of {str(name)!r} from its extension; pass "
                         f"--format ({', '.join(FORMATS)})")
    return fmt
