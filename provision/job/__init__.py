"""The job layer: a job's life on a cluster (lifecycle.py, in order: sync, gate, start,
follow, keep checkpoints, detect, recover, fetch, record) and the modules owning each step
(launch, launchers/, jobs, gate, fabric, recovery, checkpoints, collect, diagnose, programs).
Imports only the cluster, nodes and model layers.
"""
