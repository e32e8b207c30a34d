"""The benchmark harness behind bench/run.py and bench/reads_bench.py, one module per role:
``bodies`` writes the request bodies from the sample day; ``proc`` is the one /proc reader
(process trees, CPU-seconds per process, the machine's busy CPU, RSS, load average, the key
store's size); ``services`` starts and stops the server configurations (LocalServer,
NginxFront, ComposeFront, the nginx.conf they use, /healthz); ``drivers`` builds and parses the
load drivers' runs (the one ab command line and parser, bench/post_load.py's);
``plans`` names the configurations and the interleaved experiments; ``runner`` measures points
(Runner, PointSpec), runs sweeps and interleaved experiments and prints each point;
``output`` describes the machine and writes results.json and results.csv.
"""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
