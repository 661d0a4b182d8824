"""Property tests draw the same examples on every run: a suite that passes once passes again
(``derandomize``), and no example database is written beside the code."""

from hypothesis import settings

settings.register_profile("autoplan", derandomize=True, database=None)
settings.load_profile("autoplan")
