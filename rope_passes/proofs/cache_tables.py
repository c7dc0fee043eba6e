"""The cos/sin table a GroupQueryAttention reads, by value: a constant table, or ``longrope-concat``'s batch switch
read for rows of one length (:class:`rope_passes.analysis.caches.SwitchedHead`), its heads proved first."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from rope_passes.analysis.caches import switched_head
from rope_passes.proofs.constants import table as table_value

__all__ = ["cache_table"]


def cache_table(value: ir.Value | None) -> np.ndarray | None:
    """The cos/sin table a GroupQueryAttention reads for rows of one length: a constant table's value
    (:func:`rope_passes.proofs.constants.table`), or for ``longrope-concat``'s batch switch
    (:class:`rope_passes.analysis.caches.SwitchedHead`) ``[short[:o]; long]``, once its other head is proved the long
    table's first ``o`` rows (bit for bit: then either head is a row of one of the two tables). None otherwise."""
    switched = switched_head(value)
    if switched is None:
        return table_value(value)
    head_long, head_short, long = (table_value(v) for v in switched.tables)
    if head_long is None or head_short is None or long is None or not np.array_equal(head_long,
                                                                                      long[:switched.offset]):
        return None
    return np.concatenate([head_short, long], axis=0)
