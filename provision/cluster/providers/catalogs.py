"""What the providers' catalogs share: the per-type fabric table lookup (each catalog keeps
its own FABRIC table, by its own machine type names)."""

from __future__ import annotations

from collections.abc import Mapping

from provision.model.inventory import FabricExpectation


def expectation_in(table: Mapping[str, FabricExpectation],
                   machine_type: str) -> FabricExpectation | None:
    """The table's row for a type (a copy: the inventory gets its own), or None for a type
    without a fabric worth gating (single-GPU shapes, unknown types)."""
    row = table.get(machine_type)
    return row.model_copy() if row is not None else None
