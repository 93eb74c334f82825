import os
import sys

from hypothesis import settings

sys.path.insert(0, os.path.dirname(__file__))

# CI: a fixed example sequence, so a red run is reproducible and a green one is not luck.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")
