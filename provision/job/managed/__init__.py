"""Managed runs (issue 18): a job supervised by the cluster's controller, its state and
checkpoints in a durable store. The design: docs/ARCHITECTURE.md, "Where the control plane lives"."""
