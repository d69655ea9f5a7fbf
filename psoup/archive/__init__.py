"""Durability: the write-ahead log and the Parquet archive of expired data.

PSoup keeps only a maximum window in its Data SteMs and leaves disk-resident streams to
future work (PSoup paper, Sect. 4.2, footnote 3); "Remembrance of Streams Past" (Sect. 5.1)
archives a stream as an append-only store clustered by timestamp. psoup splits that job in
two (ARCHITECTURE.md, "Archive and history"):

- `psoup.archive.wal.WriteAheadLog`: every acknowledged insert or registration, framed and
  checksummed, so a restarted engine replays exactly what it acknowledged (invariant 4);
- `psoup.archive.parquet.Archive`: tuples that left retention, as Parquet files partitioned
  by stream and UTC day, for the Spark job and any Parquet reader.
"""
