"""The asv suite: fa_kernel's forward time, time relative to cuDNN, accuracy and TFLOP/s.

`perf` and `accuracy` hold the gated figures, all lower-is-better, which `nox -s bench`
compares between two commits; `throughput` holds TFLOP/s, recorded for the dashboard and
never compared (asv would read a higher TFLOP/s as a regression). Every benchmark skips
where there is no CUDA device. docs/benchmarking.md says how to run them.
"""

import os
import site

# asv >= 0.6.5 hands ASV_PYTHONPATH to a benchmark process as its PYTHONPATH, yet asv 0.6.6's own
# benchmark.py then drops those entries before importing this suite. asv.offline.conf.json needs
# them (torch and TileLang come from the runner's Python: its site-packages), so they are added
# back as site directories, after the environment's own, so that the fa_kernel installed for the
# commit under test wins over any other copy.
for _entry in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    if _entry:
        site.addsitedir(_entry)
