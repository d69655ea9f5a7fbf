"""The archive: tuples that left a Data SteM's retention, as Parquet by stream and day.

PSoup keeps only a maximum window in its Data SteMs and leaves disk-resident streams to
future work (PSoup paper, Sect. 4.2, footnote 3); "Remembrance of Streams Past" (Sect. 5.1)
archives a stream as an append-only store clustered by timestamp:

- `psoup.archive.layout`: the part files' layout, names, types and checks;
- `psoup.archive.parquet.Archive`: writes expired tuples as part files, for the Spark jobs
  (psoup.spark) and any Parquet reader;
- `psoup.archive.sampling`: the part files' sampled layout (row groups that are each a
  uniform sample), its writers and readers; `psoup.archive.rates` its rate arithmetic;
- `psoup.archive.policy`: how much of the archive a read takes under overload (a time
  budget, a constant rate, by age);
- `psoup.archive.rollups.Rollups`: the part files' aggregate copies (COUNT, SUM, MIN,
  MAX per minute, hour and day), kept beside the archive for aggregates over long
  past windows.
"""
