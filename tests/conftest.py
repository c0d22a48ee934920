"""Shared by both environments: a reproducible hypothesis profile for CI.

Locally hypothesis explores new examples every run; ``HYPOTHESIS_PROFILE=ci`` (set by .ci/run)
derandomizes it so a CI result can be reproduced exactly.
"""

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
