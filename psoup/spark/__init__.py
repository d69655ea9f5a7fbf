"""Spark jobs over the archive: import, replay and historical evaluation (PySpark).

Nothing here is imported by `import psoup`; Spark starts only when one of these jobs
runs (psoup.spark.session).
"""
