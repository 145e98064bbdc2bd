"""Test-wide settings.

Hypothesis runs derandomized by default so every run of ``make test`` is the same run; set
``HYPOTHESIS_PROFILE=explore`` to search with fresh randomness locally.
"""

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("explore", deadline=None, print_blob=True, max_examples=2_000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
