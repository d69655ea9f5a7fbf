"""psoup's kernels, the loops of its hot paths, from the backend chosen once at import by
the environment variable PSOUP_KERNELS:

* "numba" (the default): the compiled kernels of `psoup.kernels.compiled` (importing
  numba and llvmlite, about half a second; each kernel compiled on first use and cached
  on disk);
* "numpy": their plain numpy twins in `psoup.kernels.reference`, same names, signatures
  and results, numba never imported: for platforms numba does not support, and for
  debugging (bounds-checked arrays, Python tracebacks, no compile time).

Every name is the backend's own object (no indirection per call), so a call site
`kernels.probe_into(...)` costs what the backend's function costs. The two import lists
below name the same things, and the type checker holds each twin to its compiled
kernel's signature (an incompatible import is an error). `layout` holds what
both share: the chunk row forms (`WORD_MAJOR`, `SLICED`), `TILE_WORDS` and
`AddressTable`, the chunk list the kernels that walk chunks take (as its `handle`: the
int64 table under numba, the arrays under numpy).

Any other value of PSOUP_KERNELS is a ValueError at import naming the variable and the
choices.
"""

from __future__ import annotations

from psoup.kernels.layout import BACKEND, BACKEND_VARIABLE, BACKENDS

if BACKEND == "numba":
    from psoup.kernels.compiled import (
        SLICED,
        TILE_WORDS,
        WORD_MAJOR,
        AddressTable,
        Handle,
        address_table,
        block_fold,
        block_prefix,
        chunk_gather,
        chunk_key_counts,
        chunk_key_range,
        chunk_positions,
        chunk_scatter,
        chunk_select,
        clear_bit,
        fingerprint,
        float_prefix,
        interval_fold,
        interval_gather,
        interval_scan,
        marked_copy,
        probe_into,
        set_bits,
        slice_row,
        ts_fault,
        word_positions,
        write_column,
    )
else:
    from psoup.kernels.reference import (
        SLICED,
        TILE_WORDS,
        WORD_MAJOR,
        AddressTable,
        Handle,
        address_table,
        block_fold,
        block_prefix,
        chunk_gather,
        chunk_key_counts,
        chunk_key_range,
        chunk_positions,
        chunk_scatter,
        chunk_select,
        clear_bit,
        fingerprint,
        float_prefix,
        interval_fold,
        interval_gather,
        interval_scan,
        marked_copy,
        probe_into,
        set_bits,
        slice_row,
        ts_fault,
        word_positions,
        write_column,
    )

__all__ = ["BACKEND", "BACKENDS", "BACKEND_VARIABLE", "SLICED", "TILE_WORDS", "WORD_MAJOR",
           "AddressTable", "Handle", "address_table", "block_fold", "block_prefix",
           "chunk_gather", "chunk_key_counts",
           "chunk_key_range", "chunk_positions", "chunk_scatter", "chunk_select", "clear_bit",
           "fingerprint", "float_prefix", "interval_fold", "interval_gather", "interval_scan",
           "marked_copy",
           "probe_into", "set_bits", "slice_row", "ts_fault", "word_positions",
           "write_column"]
