"""Run a training script K times on this rank, each time in a fresh interpreter that meets
the other ranks at a port of its own (MASTER_PORT + 1 + i), and print every run's exit code:
`rank R exit codes [0, 0, -6, ...]`. Counts how often a job that finished its work fails at
interpreter exit (tests/integration/test_first_use.py, benchmarks/exit_abort_rate.py)."""
import os
import subprocess
import sys

script, reps = sys.argv[1], int(sys.argv[2])
base = int(os.environ["MASTER_PORT"])
codes = []
for i in range(reps):
    # rank 0's run serves the rendezvous store itself (not torchrun's agent, which only
    # serves MASTER_PORT)
    env = {**os.environ, "MASTER_PORT": str(base + 1 + i),
           "TORCHELASTIC_USE_AGENT_STORE": "False"}
    codes.append(subprocess.call([sys.executable, script], env=env))
print(f"rank {os.environ['RANK']} exit codes {codes}", flush=True)
