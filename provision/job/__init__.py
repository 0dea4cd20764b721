"""The job layer: a job's life on a cluster (lifecycle.py, in order: check, sync, gate, start;
then the supervision's own: attached.py follows, keeps checkpoints, detects, recovers, fetches,
records; detached.py leaves it to the nodes; managed/ hands it to the cluster's controller)
and the modules owning each step (launch, launchers/, jobs, gate/, recovery, checkpoints,
collect, diagnose, programs; jobrecords.py: the records, whoever keeps them). managed/ sits on
top of the rest (the store, the controller, the choice of supervision): nothing else here
imports it. Imports only the cluster, nodes and model layers.
"""
