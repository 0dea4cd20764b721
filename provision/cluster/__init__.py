"""The cluster layer: a cluster's life (pipeline.py: plan, create with rollback, destroy) and
its providers (providers/: one folder each behind one contract), the cost history, bring-up
progress. Imports only the nodes and model layers.
"""
