"""Sample rates of the archive's sampled layout (psoup.archive.sampling), as numbers:
what a rate rounds to, which draws it takes. No pyarrow here: the engine imports this
to plan history jobs, and an engine without an archive never loads pyarrow.
"""

from __future__ import annotations

import math

from psoup.query.model import SampleMethod

#: Draws are uniform in [0, SAMPLE_SPACE): sample rates are multiples of its inverse.
SAMPLE_SPACE = 1 << 10
#: Row groups per run of a part file: a read of rate p reads ceil(p x this) of them.
SAMPLE_GROUPS = 16
#: Draw values per row group (of a run of at least SAMPLE_GROUPS x MIN_GROUP_ROWS).
GROUP_WIDTH = SAMPLE_SPACE // SAMPLE_GROUPS
#: The fewest rows a row group of a run is cut to (a smaller run gets fewer groups).
MIN_GROUP_ROWS = 1024


def threshold(rate: float) -> int:
    """The draws below this are in the sample of `rate` (0 < rate <= 1): rate x
    SAMPLE_SPACE rounded to the nearest, at least 1. O(1).

    Example:
        >>> threshold(0.25), threshold(1.0), threshold(1e-9)
        (256, 1024, 1)
    """
    if not 0.0 < rate <= 1.0:
        raise ValueError(f"a sample rate is in (0, 1], not {rate}")
    return max(1, min(SAMPLE_SPACE, round(rate * SAMPLE_SPACE)))


def bernoulli_rate(rate: float) -> float:
    """The rate a BERNOULLI sample of `rate` really has (a multiple of 1/SAMPLE_SPACE).

    Example:
        >>> bernoulli_rate(0.1)
        0.099609375
    """
    return threshold(rate) / SAMPLE_SPACE


def system_rate(rate: float) -> float:
    """The rate a SYSTEM sample of `rate` has: whole row groups, so `rate` rounded up to
    a multiple of 1/SAMPLE_GROUPS.

    Example:
        >>> system_rate(0.1), system_rate(0.25)
        (0.125, 0.25)
    """
    if not 0.0 < rate <= 1.0:
        raise ValueError(f"a sample rate is in (0, 1], not {rate}")
    return min(SAMPLE_GROUPS, math.ceil(rate * SAMPLE_GROUPS - 1e-9)) / SAMPLE_GROUPS


def sample_rate(method: SampleMethod, fraction: float) -> float:
    """The rate a TABLESAMPLE `method` of `fraction` reads at.

    Example:
        >>> sample_rate(SampleMethod.SYSTEM, 0.3), sample_rate(SampleMethod.BERNOULLI, 0.25)
        (0.3125, 0.25)
    """
    if method == SampleMethod.SYSTEM:
        return system_rate(fraction)
    return bernoulli_rate(fraction)
