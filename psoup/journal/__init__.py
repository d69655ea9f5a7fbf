"""Durability: what `Engine(path=DIR)` logs before acknowledging a change.

- `psoup.journal.wal.WriteAheadLog`: every acknowledged change, framed and checksummed,
  so a restarted engine replays exactly what it acknowledged;
- `psoup.journal.journal.Journal`: the engine's durable side, the log plus the Parquet
  archive (psoup.archive) that receives what leaves retention, with checkpoints.
"""
