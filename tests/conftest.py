"""Shared test settings: hypothesis profiles, a clock fixture, and one Spark session."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from tests.support import Clock

settings.register_profile(
    "ci", max_examples=int(os.environ.get("PSOUP_EXAMPLES", "500")), deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True)
settings.register_profile(
    "dev", max_examples=60, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# The one Spark session of the run is local[2], whichever test starts it: the `spark`
# fixture, or an engine's history job or a replay in a test that does not ask for it
# (a running session refuses another master instead of ignoring it).
os.environ["PSOUP_SPARK_CONF"] = "spark.master=local[2]"


@pytest.fixture
def clock() -> Clock:
    """A settable clock at 1000.0 (tests.support.Clock) for an engine under test."""
    return Clock(1000.0)


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local[2] SparkSession for the whole test run (it takes seconds to start),
    shared with psoup.spark's own jobs and stopped at the end."""
    pytest.importorskip("pyspark")
    from psoup.spark.session import spark_session, stop_session

    session = spark_session()
    assert session.sparkContext.master == "local[2]"
    yield session
    stop_session()
