"""Managed runs (issue 18): a job supervised by the cluster's controller, its state and
checkpoints in a durable store. docs/managed-runs.md is the design."""
