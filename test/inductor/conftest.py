"""Settings every test of this directory runs with, in its processes and theirs.

Collective autotuning that tunes nothing because the op's default (or every
candidate) failed is an error here (``collective_benchmark_strict``), so
that no test passes by tuning nothing; a test about that case turns it off.
Set before Inductor's config is imported, and inherited by every rank
process and launched job.
"""

import os


os.environ.setdefault("TORCHINDUCTOR_COLLECTIVE_BENCHMARK_STRICT", "1")
