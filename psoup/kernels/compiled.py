"""The compiled kernels of psoup's hot loops (numba, compiled on first use and cached on
disk next to this file, or in the user's cache directory when that is read-only): the
backend `psoup.kernels` exposes by default. Each public kernel has a numpy twin of the
same name and signature in `psoup.kernels.reference`.

* `probe_into`: the shared probe of a batch (PSoup Fig. 3, new data over old queries):
  per tuple, look up its cell in each attribute index (through a direct value -> row
  map for small integers), OR the cells' reject rows, invert, AND the stream's interest
  row, and store the result word-major (word w of every tuple in a row of its own, so a
  query's matches are one contiguous run of words). Rows are computed tuple-major into a
  tile in the L1 cache, then turned word-major in 8 x 8 blocks of words through registers
  (`_store_transposed8`; ragged edges word by word). No intermediate arrays: the values
  are read once, their cells looked up as their rows are gathered (a direct map's range
  checked in a pass before). O(n * attributes * words) word operations, n * words words
  written with streaming stores (results are read at invocation, not now: not reading
  each line before writing it halves the memory traffic, 1.5x the probe's rate at 1,024
  queries).
* `word_positions`: the find of an invocation over a word-major bitmap: the rows of a
  word run with the query's bit set, 64 rows tested into one match mask at a time, O(rows)
  tests and O(matches) writes where matches are sparse.
* `chunk_positions`: the find of an invocation over every chunk of a window in one call
  (`word_positions` per chunk, the chunks given by an `address_table`). A sealed chunk's
  word row (one the probe writes no more) is turned bit-sliced by the first find that
  reads it (`slice_row`: 64 x 64 bit blocks transposed in place, the row's form kept in
  its first padding word), so later finds read W / 8 bytes of the query's own bits.
* `chunk_gather`: the values of several 8-byte columns of a Data SteM at sorted
  positions across its chunks, in one call: O(columns x positions), no temporary arrays.
* `chunk_select`: `chunk_positions` and `chunk_gather` in one call (an invocation's
  find and fetch over a position range), dense runs of matches copied eight values at
  a time (`_compress8`), the positions never written unless asked for; `marked_copy`: more
  columns through the same matches later, without the find.
* `interval_scan`: the positions of a chunked store whose values lie in given closed
  intervals of several 8-byte columns (a new query's interval factors over the retained
  tuples), in one call: 64-row match masks per interval, ANDed; O(rows x intervals).
* `block_fold`: matches at sorted positions folded into per-block, per-group cells
  (count, latest position, compensated FLOAT or exact INT sums, MIN, MAX), read in place,
  each block's running values in a few registers or group-sized arrays and written to
  its cells once; `interval_fold`: `interval_scan` and `block_fold` in one pass, each
  chunk folded while it is in the cache; `block_prefix`: compensated prefix sums of
  the blocks' FLOAT pairs (psoup.results.blocks, an aggregate index by blocks).
* `ts_fault`: the first row of a batch whose ts is not finite or goes back in time.
* `clear_bit`, `set_bits`: one query's bit in every chunk of a chunked bitmap cleared
  (a query leaving), or set at given positions (a new query's matches), in one call.
* `write_column`: a query's bit column in an attribute's reject table, set in the rows
  of the cells it rejects and cleared elsewhere, in one pass over the cells.

Importing this module imports numba and llvmlite (about half a second). The engine's
modules import `psoup.kernels` at their top (an import statement inside a hot function
costs about a microsecond each time); modules a client or the command line loads without
an engine do not.

Types: numba's decorators hand the type checker a dispatcher, not the kernel's
signature, so each kernel here is decorated through `_njit`, which keeps its annotated
signature (numba ignores annotations; the intrinsics, called only from compiled code,
are Any).
The kernels that walk chunks are compiled as `_name` over the int64 table of an
`AddressTable` and exported as `name` typed to take its `handle` (under this backend,
that table), with no Python function between the call and the dispatcher.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, TypeVar, cast

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils as _cgutils
from numba.extending import intrinsic, overload
from numba.np.numpy_support import carray
from numpy.typing import NDArray

from psoup.kernels import layout
from psoup.kernels.layout import SLICED, TILE_WORDS, WORD_MAJOR, AddressTable, Handle, address_table

__all__ = ["SLICED", "TILE_WORDS", "WORD_MAJOR", "AddressTable", "Handle", "address_table",
           "block_fold", "block_prefix", "chunk_gather", "interval_fold", "chunk_key_counts",
           "chunk_key_range",
           "chunk_positions",
           "chunk_scatter", "chunk_select", "clear_bit", "fingerprint", "float_prefix",
           "interval_gather", "interval_scan", "marked_copy", "probe_into", "set_bits",
           "slice_row", "ts_fault", "word_positions", "write_column"]

_F = TypeVar("_F", bound=Callable[..., Any])


#: numba's code generation helpers carry no annotations
cgutils: Any = _cgutils


def _njit(*, cache: bool, nogil: bool, boundscheck: bool,
          inline: Literal["never", "always"] = "never") -> Callable[[_F], _F]:
    """numba.njit with these options, typed: the decorated function keeps its annotated
    signature for the type checker (numba itself ignores annotations)."""
    return cast("Callable[[_F], _F]", njit(cache=cache, nogil=nogil, boundscheck=boundscheck,
                                           inline=inline))


def _intrinsic(codegen: Callable[..., Any]) -> Any:
    """numba.extending.intrinsic, typed: what it makes is only called from compiled
    code, where the type checker does not follow."""
    return intrinsic(codegen)


@_intrinsic
def _stream_store(typingctx: Any, array: Any, index: Any, value: Any) -> Any:  # pragma: no cover
    """array[index] = value as a non-temporal (streaming) store: the line is not read
    first and not kept in the cache. For results written now and read much later: it
    halves the memory traffic of writing them. Follow with `_store_fence`."""
    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        kind = signature.args[0]
        view = context.make_array(kind)(context, builder, args[0])
        where = cgutils.get_item_pointer(context, builder, kind, view, [args[1]],
                                         wraparound=False)
        store = builder.store(args[2], where)
        store.set_metadata("nontemporal",
                           builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)]))
        return context.get_dummy_value()
    return types.void(array, index, array.dtype), codegen


@_intrinsic
def _store_fence(typingctx: Any) -> Any:  # pragma: no cover - compiled
    """A full memory fence: streaming stores are visible to every thread after it."""
    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        builder.fence("seq_cst")
        return context.get_dummy_value()
    return types.void(), codegen


#: 8x8 transposition of 64-bit lanes in three rounds of two-vector shuffles: round r
#: pairs vectors (a, b) and takes lanes by these masks (lanes 8.. are b's).
_ROUNDS = (
    (1, [0, 8, 2, 10, 4, 12, 6, 14], [1, 9, 3, 11, 5, 13, 7, 15]),   # pairs of rows
    (2, [0, 1, 8, 9, 4, 5, 12, 13], [2, 3, 10, 11, 6, 7, 14, 15]),   # pairs of pairs
    (4, [0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15]),   # halves
)


@_intrinsic
def _store_transposed8(typingctx: Any, tile: Any, t0: Any, w0: Any, keep: Any, out: Any,
                       i: Any) -> Any:  # pragma: no cover
    """out[w0 + k, i + j] = ~tile[t0 + j, w0 + k] & keep[w0 + k] for j, k < 8: an 8 x 8
    block of words loaded as eight 8-word vectors, transposed in registers (24 shuffles),
    inverted and masked, and written as eight 8-word streaming stores. The caller
    guarantees each out[w0 + k, i] is 64-byte aligned and each out row contiguous (a
    streaming vector store needs both: an unaligned one faults); follow with
    `_store_fence`."""
    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        tile_ty, _, _, keep_ty, out_ty, _ = signature.args
        tile_v = context.make_array(tile_ty)(context, builder, args[0])
        keep_v = context.make_array(keep_ty)(context, builder, args[3])
        out_v = context.make_array(out_ty)(context, builder, args[4])
        t0_v, w0_v, i_v = args[1], args[2], args[5]
        vec = ir.VectorType(ir.IntType(64), 8)
        intp = context.get_value_type(types.intp)

        def at(n: Any, k: int) -> Any:
            return builder.add(n, ir.Constant(intp, k))

        rows = []
        for j in range(8):
            where = cgutils.get_item_pointer(context, builder, tile_ty, tile_v,
                                             [at(t0_v, j), w0_v], wraparound=False)
            rows.append(builder.load(builder.bitcast(where, vec.as_pointer()), align=8))
        for step, low, high in _ROUNDS:
            lanes = [ir.Constant(ir.VectorType(ir.IntType(32), 8), m) for m in (low, high)]
            shuffled = list(rows)
            for a in range(8):
                if a & step:
                    continue
                b = a + step
                shuffled[a] = builder.shuffle_vector(rows[a], rows[b], lanes[0])
                shuffled[b] = builder.shuffle_vector(rows[a], rows[b], lanes[1])
            rows = shuffled
        nontemporal = builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)])
        ones = ir.Constant(vec, [(1 << 64) - 1] * 8)
        broadcast = ir.Constant(ir.VectorType(ir.IntType(32), 8), [0] * 8)
        for k in range(8):
            where = cgutils.get_item_pointer(context, builder, keep_ty, keep_v,
                                             [at(w0_v, k)], wraparound=False)
            keep1 = builder.insert_element(ir.Constant(vec, ir.Undefined), builder.load(where),
                                           ir.Constant(ir.IntType(32), 0))
            keep8 = builder.shuffle_vector(keep1, keep1, broadcast)
            value = builder.and_(builder.xor(rows[k], ones), keep8)
            where = cgutils.get_item_pointer(context, builder, out_ty, out_v,
                                             [at(w0_v, k), i_v], wraparound=False)
            store = builder.store(value, builder.bitcast(where, vec.as_pointer()), align=64)
            store.set_metadata("nontemporal", nontemporal)
        return context.get_dummy_value()
    return types.void(tile, types.intp, types.intp, keep, out, types.intp), codegen


@_intrinsic
def _or_rows(typingctx: Any, o: Any, a: Any, b: Any, c: Any, d: Any, words: Any,
             into: Any) -> Any:  # pragma: no cover - compiled
    """o[:words] = a[:words] | b[:words] | c[:words] | d[:words] (`into` a literal True:
    o[:words] |= them), 8 words at a time as vectors, the rest one by one. Written as a
    loop in Python, LLVM checked at run time for each tuple that o overlaps none of the
    rows, and with 16 words (1,024 queries) took its 4-word loop (measured, the probe of
    8,192 tuples at 1,024 queries 87-93 us that way, 80-83 us this way)."""
    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        word = ir.IntType(64)
        vec = ir.VectorType(word, 8)
        intp = context.get_value_type(types.intp)
        views = [context.make_array(signature.args[k])(context, builder, args[k])
                 for k in range(5)]

        def at(k: int, w: Any, kind: Any) -> Any:
            # word w of the row's data: every row's words are contiguous, also those of a
            # table cut to some words (`_probe4_blocked`), whose arrays numba types with
            # a stride known only at run time (LLVM then gathered the last words)
            where = builder.gep(views[k].data, [w], inbounds=True)
            return builder.bitcast(where, kind.as_pointer())

        def one_step(w: Any, kind: Any) -> None:
            rows = [builder.load(at(k, w, kind), align=8) for k in (1, 2, 3, 4)]
            value = builder.or_(builder.or_(rows[0], rows[1]), builder.or_(rows[2], rows[3]))
            if signature.args[6].literal_value:
                value = builder.or_(value, builder.load(at(0, w, kind), align=8))
            builder.store(value, at(0, w, kind), align=8)
        full = builder.and_(args[5], ir.Constant(intp, -8))
        with cgutils.for_range_slice(builder, ir.Constant(intp, 0), full,
                                     ir.Constant(intp, 8), intp) as (w, _):
            one_step(w, vec)
        with cgutils.for_range_slice(builder, full, args[5], ir.Constant(intp, 1),
                                     intp) as (w, _):
            one_step(w, word)
        return context.get_dummy_value()
    if not isinstance(into, types.BooleanLiteral):
        return None
    return types.void(o, a, b, c, d, types.intp, into), codegen


@_njit(cache=True, nogil=True, boundscheck=False)
def _aligned_from(out: NDArray[np.uint64]) -> int:  # pragma: no cover - compiled
    """The first tuple i from which out[w, i] is 64-byte aligned in every row w, or the
    number of tuples when no such i exists (rows not contiguous, or rows at distances
    that are not whole cache lines: every word is then written on its own)."""
    words: int
    n: int
    words, n = out.shape
    if n == 0 or out.strides[1] != 8 or (words > 1 and out.strides[0] % 64 != 0):
        return n
    address = out.ctypes.data
    if address % 8 != 0:
        return n
    return min(n, (-address % 64) // 8)


@_njit(cache=True, nogil=True, boundscheck=False, inline="always")
def _first_outside(keys: tuple[NDArray[np.int64], ...], firsts: tuple[int, ...],
                   maps: tuple[NDArray[np.int64], ...], given: int,
                   n: int) -> int:  # pragma: no cover - compiled
    """The first of the `given` tables one of whose n keys falls outside its map, or -1:
    every key inside its map, or the probe writes nothing. The tables past the `given`
    ones repeat the first (padding to four), whose keys are checked already. One
    branch-free pass per table, O(n * given)."""
    for g in range(given):
        keyed, first, m = keys[g], firsts[g], len(maps[g])
        inside = True
        for i in range(n):
            inside &= (keyed[i] - first >= 0) & (keyed[i] - first < m)
        if not inside:
            return g
    return -1




@_njit(cache=True, nogil=True, boundscheck=False)
def _probe4(tables: tuple[NDArray[np.uint64], ...], keys: tuple[NDArray[np.int64], ...],
            firsts: tuple[int, ...], maps: tuple[NDArray[np.int64], ...],
            interest: NDArray[np.uint64], out: NDArray[np.uint64],
            given: int) -> int:  # pragma: no cover - compiled
    words, n = out.shape
    groups = len(tables) // 4
    outside = _first_outside(keys, firsts, maps, given, n)
    if outside >= 0:
        return outside
    block = max(8, TILE_WORDS // words // 8 * 8)
    tile = np.empty((block, words), np.uint64)
    aligned = _aligned_from(out)
    full_words = words // 8 * 8
    # the first four tables' arrays held in locals, and every index unsigned: a signed
    # one costs a test for a negative index (numpy's wraparound) per lookup, three of
    # them per table and tuple; none can be negative here (`_first_outside` checked the
    # keys, a map holds rows). Measured, 8,192 tuples at 1,024 queries: 62-68 us with
    # signed indices, 52-56 us so (alternated in one process).
    ta, tb, tc, td = tables[0], tables[1], tables[2], tables[3]
    ka, kb, kc, kd = keys[0], keys[1], keys[2], keys[3]
    ma, mb, mc, md = maps[0], maps[1], maps[2], maps[3]
    fa, fb, fc, fd = firsts[0], firsts[1], firsts[2], firsts[3]
    i0 = 0
    while i0 < n:
        # the tuples before the first aligned one form a tile of their own
        m = min(block, n - i0) if i0 >= aligned else min(block, aligned - i0)
        for t in range(m):
            i = np.uint64(i0 + t)
            o = tile[np.uint64(t)]
            a = ta[np.uint64(ma[np.uint64(ka[i] - fa)])]
            b = tb[np.uint64(mb[np.uint64(kb[i] - fb)])]
            c = tc[np.uint64(mc[np.uint64(kc[i] - fc)])]
            d = td[np.uint64(md[np.uint64(kd[i] - fd)])]
            _or_rows(o, a, b, c, d, words, False)
            for g in range(4, 4 * groups, 4):
                a = tables[g][np.uint64(maps[g][np.uint64(keys[g][i] - firsts[g])])]
                b = tables[g + 1][np.uint64(maps[g + 1][np.uint64(keys[g + 1][i] -
                                                                  firsts[g + 1])])]
                c = tables[g + 2][np.uint64(maps[g + 2][np.uint64(keys[g + 2][i] -
                                                                  firsts[g + 2])])]
                d = tables[g + 3][np.uint64(maps[g + 3][np.uint64(keys[g + 3][i] -
                                                                  firsts[g + 3])])]
                _or_rows(o, a, b, c, d, words, True)
        # 8 x 8 blocks through registers where out is aligned; the ragged rest word by word
        blocks = m // 8 * 8 if i0 >= aligned else 0
        for t0 in range(0, blocks, 8):
            for w0 in range(0, full_words, 8):
                _store_transposed8(tile, t0, w0, interest, out, i0 + t0)
        for w in range(words):
            keep = interest[w]
            row = out[w]
            for t in range(0 if w >= full_words else blocks, m):
                _stream_store(row, i0 + t, ~tile[t, w] & keep)
        i0 += m
    _store_fence()
    return -1


@_njit(cache=True, nogil=True, boundscheck=False)
def _probe4_blocked(tables: tuple[NDArray[np.uint64], ...],
                    keys: tuple[NDArray[np.int64], ...], firsts: tuple[int, ...],
                    maps: tuple[NDArray[np.int64], ...], interest: NDArray[np.uint64],
                    out: NDArray[np.uint64], given: int) -> int:  # pragma: no cover
    """`_probe4` of four tables, BLOCK_WORDS words of every tuple at a time: the tables'
    rows cut to those words (all the cells' of the four tables: 0.5 MB in the Fig. 9
    workload) stay in this core's L2 rather than being read from the shared L3 again
    for each tuple. The blocks run in one compiled call, so threads probing shares of a
    batch at once do not take turns for the GIL between blocks (with a Python loop over
    the blocks, two threads on 2 cores used 1.0-1.3 cores)."""
    words = out.shape[0]
    check = given
    for w0 in range(0, words, layout.BLOCK_WORDS):
        w1 = min(words, w0 + layout.BLOCK_WORDS)
        cut = (tables[0][:, w0:w1], tables[1][:, w0:w1], tables[2][:, w0:w1],
               tables[3][:, w0:w1])
        g = _probe4(cut, keys, firsts, maps, interest[w0:w1], out[w0:w1], check)
        if g >= 0:
            return g        # (only the first block checks the keys: nothing written)
        check = 0
    return -1


def probe_into(tables: tuple[NDArray[np.uint64], ...], keys: tuple[NDArray[np.int64], ...],
               firsts: tuple[int, ...], maps: tuple[NDArray[np.int64], ...],
               interest: NDArray[np.uint64], out: NDArray[np.uint64]) -> int:
    """out[:, i] = ~(tables[0][maps[0][keys[0][i] - firsts[0]]] | ...) & interest: each
    tuple's cell in each attribute looked up and its reject row ORed in the same pass, no
    intermediate arrays.

    Args:
        tables: a tuple of C-contiguous (rows, >= words) uint64 reject tables.
        keys: a tuple (one per table) of n int64 keys: an attribute's integer values
            themselves where its index keeps a direct value -> row map, else the table
            rows found for its values (with an identity map); writable or read-only.
        firsts: a tuple of ints, the key of each map's first entry.
        maps: a tuple of int64 arrays, key - first -> table row.
        interest: the interest row (>= words uint64).
        out: a (words, n) uint64 array, word-major (tuple i's word w at out[w, i]; rows
            of it may be far apart, e.g. a slice of PSoup-P's chunk), overwritten.

    Returns -1; or, writing nothing, the first table g one of whose keys falls outside
    maps[g] (a value the direct map has not seen: the caller widens it, or looks the
    values up otherwise, and calls again). The range check is one branch-free pass over
    the keys before the probe, O(n * tables); the probe O(n * tables * words). The tables
    are taken four at a time (padded by repeating the first: OR is idempotent), so one
    compiled loop serves any number of attributes.
    """
    given, pad = len(tables), -len(tables) % 4
    if not _alike(keys):
        keys = tuple([_read_only(k) for k in keys])
    words, n = out.shape
    blocked = (given + pad == 4 and words >= layout.BLOCK_FROM_WORDS
               and n * words >= layout.BLOCK_FROM_CELLS)
    return (_probe4_blocked if blocked else _probe4)(
        tables + tables[:1] * pad, keys + keys[:1] * pad, firsts + firsts[:1] * pad,
        maps + maps[:1] * pad, interest, out, given)


def _alike(keys: tuple[NDArray[np.int64], ...]) -> bool:
    """Whether the keys are all C-contiguous and all writable or all read-only: of one
    type, as the compiled probe needs them (a batch's own columns usually are; checking
    costs a quarter of making read-only views of them, 0.3 against 1.5 us for four)."""
    writable = keys[0].flags.writeable if keys else True
    for k in keys:
        flags = k.flags
        if not flags.c_contiguous or flags.writeable != writable:
            return False
    return True


def _read_only(keys: NDArray[np.int64]) -> NDArray[np.int64]:
    """A read-only, C-contiguous view of `keys` (a copy where they are not contiguous):
    the batch's own columns are among the keys, writable or not (an Arrow column is read
    only), and the compiled probe indexes its tuple of keys by number, which needs the
    keys of one type."""
    view = keys.view() if keys.flags.c_contiguous else np.ascontiguousarray(keys)
    view.flags.writeable = False
    return view


@_njit(cache=True, nogil=True, boundscheck=False)
def ts_fault(stamps: NDArray[np.float64], last: float) -> int:  # pragma: no cover - compiled
    """The first row whose ts is not finite, or is below the one before it (row 0: below
    `last`); -1 when there is none. One branch-free (vectorized) pass, O(n); the row is
    looked for only when there is a fault."""
    n = len(stamps)
    if n == 0:
        return -1
    ok = (stamps[0] - stamps[0] == 0.0) & (stamps[0] >= last)
    for i in range(1, n):   # x - x is 0 for every finite x, NaN for inf and NaN
        ok &= (stamps[i] - stamps[i] == 0.0) & (stamps[i] >= stamps[i - 1])
    if ok:
        return -1
    before = last
    for i in range(n):
        t = stamps[i]
        if not np.isfinite(t) or t < before:
            return i
        before = t
    return -1


@_intrinsic
def _opaque(typingctx: Any, x: Any) -> Any:  # pragma: no cover - compiled
    """x, passed through an empty inline assembly block LLVM cannot see into. A loop
    that reads `values[_opaque(i)]` at positions it loads is not vectorized: vectorized,
    those reads become gathers, slow on some x86-64 CPUs (see the module docstring)."""
    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        kind = args[0].type
        return builder.call(ir.InlineAsm(ir.FunctionType(kind, [kind]), "", "=r,0"),
                            [args[0]])
    return x(x), codegen


@_intrinsic
def _trailing_zeros(typingctx: Any, x: Any) -> Any:  # pragma: no cover - compiled
    """The number of trailing zero bits of a nonzero integer (one instruction)."""
    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.cttz(args[0], ir.Constant(ir.IntType(1), 0))
    return x(x), codegen


@_intrinsic
def _ones(typingctx: Any, x: Any) -> Any:  # pragma: no cover - compiled
    """The number of one bits of an integer (one instruction)."""
    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.ctpop(args[0])
    return x(x), codegen


@_intrinsic
def _words_at(typingctx: Any, address: Any) -> Any:  # pragma: no cover - compiled
    """The address of an array's memory (ndarray.ctypes.data) as a uint64 pointer."""
    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.inttoptr(args[0], ir.IntType(64).as_pointer())
    return cast(Any, types.CPointer)(types.uint64)(types.int64), codegen


@_njit(cache=True, nogil=True, boundscheck=False, inline="always")
def _chunk_at(table: NDArray[np.int64], i: int) -> NDArray[np.uint64]:  # pragma: no cover
    """The array row i of an `address_table` describes (a C-contiguous view, no
    reference count taken)."""
    chunk: NDArray[np.uint64] = carray(_words_at(table[i, 0]), (table[i, 1], table[i, 2]))
    return chunk


#: Above this many matches in 64 rows, writing all 64 positions branch-free is cheaper
#: than visiting the matches one by one.
_DENSE = 16


@_njit(cache=True, nogil=True, boundscheck=False)
def _scan(words: NDArray[np.uint64], mask: np.uint64, start: int, r0: int, r1: int, base: int,
          out: NDArray[np.int64], k: int) -> int:  # pragma: no cover - compiled
    """`word_positions` writing from out[k]; returns the new k. With start >= 0 the
    words are a SLICED row (see WORD_MAJOR) whose slot's bits begin at words[start]:
    each 64 rows' match mask is then one word of them (a ragged head or tail, fewer than
    64 rows, one word's bits shifted), not 64 word tests."""
    one = np.uint64(1)
    zero = np.uint64(0)
    r = r0
    while r < r1:
        off = r & 63
        if start >= 0 and off == 0 and r + 64 <= r1:
            m = words[start + (r >> 6)]
            n = 64
        elif start >= 0:                # a ragged head or tail: up to the next group
            n = min(64 - off, r1 - r)
            m = _sliced_mask(words, start, r, r + n)
        elif r + 64 <= r1:
            n = 64
            m = zero
            run = words[r:r + 64]
            for i in range(64):
                m |= (one << np.uint64(i)) if (run[i] & mask) != zero else zero
        else:                           # the last rows: fewer than 64
            n = r1 - r
            m = zero
            run = words[r:r1]           # (not words[r + i]: LLVM gathers that)
            for i in range(n):
                m |= (one << np.uint64(i)) if (run[i] & mask) != zero else zero
        p = base + r
        if _ones(m) > _DENSE:
            for i in range(n):          # (not 64: out may end at the window's last row)
                out[k] = p + i
                k += (m >> np.uint64(i)) & one
        else:
            while m:
                out[k] = p + _trailing_zeros(m)
                k += 1
                m &= m - one
        r += n
    return k


#: The six rounds of a 64 x 64 bit transposition (word i's bits `mask` swapped, shifted
#: by `j`, with word i + j's): as rounds between 8-word vectors (j >= 8) and within them.
_SWAPS = ((32, 0x00000000FFFFFFFF), (16, 0x0000FFFF0000FFFF), (8, 0x00FF00FF00FF00FF),
          (4, 0x0F0F0F0F0F0F0F0F), (2, 0x3333333333333333), (1, 0x5555555555555555))


@_intrinsic
def _slice_block(typingctx: Any, row: Any, g: Any, groups: Any,
                 out: Any) -> Any:  # pragma: no cover - compiled
    """out[b * groups + g] = bit column b of the 64 x 64 bit matrix row[64 g:64 g + 64]
    (word t its row t), for b < 64: the block loaded as eight 8-word vectors,
    transposed in registers in six rounds (each swapping the off-diagonal halves of
    every 2j x 2j sub-block: j = 32, 16, 8 between vectors, 4, 2, 1 between lanes by
    constant shuffles), and stored word by word. Written as loops over the block, LLVM
    vectorized the narrow rounds and the strided stores into gathers and scatters,
    which some CPUs run slowly (Intel's since the Downfall fix; scatters on AMD's).
    Plain vector operations: without AVX-512 they are split into narrower ones."""
    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        row_ty, _, _, out_ty = signature.args
        row_v = context.make_array(row_ty)(context, builder, args[0])
        out_v = context.make_array(out_ty)(context, builder, args[3])
        word = ir.IntType(64)
        vec = ir.VectorType(word, 8)
        lane = ir.IntType(32)
        intp = context.get_value_type(types.intp)
        first = builder.mul(args[1], ir.Constant(intp, 64))
        where = cgutils.get_item_pointer(context, builder, row_ty, row_v, [first],
                                         wraparound=False)
        words = builder.bitcast(where, vec.as_pointer())
        v = [builder.load(builder.gep(words, [ir.Constant(intp, r)]), align=8)
             for r in range(8)]

        def splat(x: int) -> Any:
            return ir.Constant(vec, [x] * 8)

        for j, m in _SWAPS:
            shift, mask = splat(j), splat(m)
            if j >= 8:                  # vector r with vector r + j / 8, lane by lane
                step = j // 8
                for r in range(8):
                    if r & step:
                        continue
                    t = builder.and_(builder.xor(builder.lshr(v[r], shift), v[r + step]), mask)
                    v[r] = builder.xor(v[r], builder.shl(t, shift))
                    v[r + step] = builder.xor(v[r + step], t)
                continue
            partner = ir.Constant(ir.VectorType(lane, 8), [i ^ j for i in range(8)])
            low = ir.Constant(ir.VectorType(lane, 8), [i if not i & j else 8 + i
                                                       for i in range(8)])
            for r in range(8):          # lane i with lane i + j, i & j == 0
                other = builder.shuffle_vector(v[r], v[r], partner)
                t = builder.and_(builder.xor(builder.lshr(v[r], shift), other), mask)
                back = builder.shuffle_vector(t, t, partner)
                v[r] = builder.shuffle_vector(builder.xor(v[r], builder.shl(t, shift)),
                                              builder.xor(v[r], back), low)
        for b in range(64):
            at = builder.add(builder.mul(ir.Constant(intp, b), args[2]), args[1])
            where = cgutils.get_item_pointer(context, builder, out_ty, out_v, [at],
                                             wraparound=False)
            builder.store(builder.extract_element(v[b // 8], ir.Constant(lane, b % 8)),
                          where)
        return context.get_dummy_value()
    return types.void(row, types.intp, types.intp, out), codegen


@_njit(cache=True, nogil=True, boundscheck=False)
def slice_row(row: NDArray[np.uint64], cap: int) -> None:  # pragma: no cover - compiled
    """Turn a WORD_MAJOR chunk row (cap words, cap a multiple of 64, then its form word)
    SLICED in place: 64 x 64 bit blocks transposed, each slot's words gathered. O(cap)."""
    groups = cap // 64
    out = np.empty(cap, np.uint64)
    for g in range(groups):
        _slice_block(row, g, groups, out)
    row[:cap] = out
    row[cap] = SLICED


@_njit(cache=True, nogil=True, boundscheck=False)
def _ready(chunk: NDArray[np.uint64], word: int, c: int, cap: int,
           sealed: int) -> NDArray[np.uint64]:  # pragma: no cover
    """Chunk c's word row `word` (chunk holding positions c * cap ...), first made
    SLICED when it is WORD_MAJOR, cap is a multiple of 64 and the probe writes no more
    of the chunk (its positions all below `sealed`): the first find over a sealed row
    pays one transposition of it, every later find reads cap / 64 words per slot."""
    row: NDArray[np.uint64] = chunk[word]
    if row[cap] == WORD_MAJOR and cap % 64 == 0 and (c + 1) * cap <= sealed:
        slice_row(row, cap)
    return row


@_njit(cache=True, nogil=True, boundscheck=False, inline="always")
def _sliced_mask(row: NDArray[np.uint64], start: int, r: int,
                 r1: int) -> np.uint64:  # pragma: no cover - compiled
    """The match mask of rows r ... min(r + 64, r1) - 1 of a SLICED row whose slot's
    words begin at row[start] (bit i: row r + i). Inlined into its callers: a call of a
    compiled function that passes an array pays its reference count (~14 ns here, for
    one word's work); measured, `chunk_select`'s find over a 32K window 10 -> 4 us."""
    g = r >> 6
    off = r & 63
    m: np.uint64 = row[start + g]
    if off:
        m >>= np.uint64(off)
        if 64 * (g + 1) < r1:
            m |= row[start + g + 1] << np.uint64(64 - off)
    if r1 - r < 64:
        m &= (np.uint64(1) << np.uint64(r1 - r)) - np.uint64(1)
    return m


@_njit(cache=True, nogil=True, boundscheck=False)
def word_positions(words: NDArray[np.uint64], mask: np.uint64, r0: int, r1: int, base: int,
                   out: NDArray[np.int64]) -> int:  # pragma: no cover - compiled
    """Write base + r for every row r0 <= r < r1 with words[r] & mask into out; returns
    how many. Rows go 64 at a time: their tests are gathered into one 64-bit match mask
    (a vectorized loop), then a sparse mask is walked match by match (trailing-zero
    count) and a dense one written branch-free. O(r1 - r0) word tests, O(matches)
    writes for sparse runs."""
    return _scan(words, mask, -1, r0, r1, base, out, 0)


@_njit(cache=True, nogil=True, boundscheck=False)
def _chunk_positions(chunks: NDArray[np.int64], k_first: int, cap: int, p0: int, p1: int,
                     word: int, mask: np.uint64, sealed: int,
                     out: NDArray[np.int64]) -> int:  # pragma: no cover - compiled
    """`word_positions` over positions p0 <= p < p1 of a chunked bitmap in one call:
    chunk k (positions k * cap ...) is chunks[k - k_first], its word row `word` the
    bits (WORD_MAJOR or SLICED; a sealed WORD_MAJOR one, positions below `sealed`, is
    made SLICED first: `_ready`); a chunk outside the list, or too narrow to have that
    row, has no matches. Returns how many positions were written to out. O(p1 - p0)
    word tests, O((p1 - p0) / 64) in a SLICED row."""
    k = 0
    if p1 <= p0:
        return 0
    start = np.int64(_trailing_zeros(mask)) * (cap // 64)
    for c in range(p0 // cap, (p1 - 1) // cap + 1):
        i = c - k_first
        if i < 0 or i >= chunks.shape[0]:
            continue
        chunk = _chunk_at(chunks, i)
        if chunk.shape[0] <= word:
            continue
        row = _ready(chunk, word, c, cap, sealed)
        r0 = max(p0 - c * cap, 0)
        r1 = min(p1 - c * cap, cap)
        k = _scan(row, mask, start if row[cap] == SLICED else -1, r0, r1, c * cap, out, k)
    return k


@_njit(cache=True, nogil=True, boundscheck=False)
def _chunk_gather(blocks: NDArray[np.int64], k_first: int, cap: int,
                  rows_of: NDArray[np.int64], positions: NDArray[np.int64],
                  out: NDArray[np.uint64]) -> None:  # pragma: no cover - compiled
    """out[j, i] = the value of block row rows_of[j] at sorted position positions[i],
    chunk k's block being blocks[k - k_first]: several 8-byte columns of a chunked
    store, for positions across any number of chunks, in one call.
    O(len(rows_of) * len(positions))."""
    n = len(positions)
    i = 0
    while i < n:
        c = positions[i] // cap
        block = _chunk_at(blocks, c - k_first)
        base = c * cap
        end = base + cap
        j0 = i
        while i < n and positions[i] < end:
            i += 1
        for j in range(len(rows_of)):
            src = block[rows_of[j]]
            dst = out[j]
            for t in range(j0, i):
                dst[t] = src[positions[t] - base]


@_njit(cache=True, nogil=True, boundscheck=False)
def _and_within(values: NDArray[np.int64] | NDArray[np.float64], lo: float, hi: float, r0: int,
                r1: int, masks: NDArray[np.uint64]) -> None:  # pragma: no cover - compiled
    """masks[q] &= the match mask of lo <= values[r] <= hi over rows r0 + 64q ... (64 at
    a time, a vectorized loop; the last group may be short). Compiled once for int64 and
    once for float64 values."""
    one = np.uint64(1)
    zero = np.uint64(0)
    for q in range((r1 - r0 + 63) // 64):
        r = r0 + 64 * q
        m = zero
        if r + 64 <= r1:
            run = values[r:r + 64]
            for t in range(64):
                m |= (one << np.uint64(t)) if (run[t] >= lo) & (run[t] <= hi) else zero
        else:
            run = values[r:r1]          # (not values[r + t]: LLVM gathers that)
            for t in range(r1 - r):
                m |= (one << np.uint64(t)) if (run[t] >= lo) & (run[t] <= hi) else zero
        masks[q] &= m


@_njit(cache=True, nogil=True, boundscheck=False)
def _interval_masks(block: NDArray[np.uint64], r0: int, r1: int, ints: NDArray[np.int64],
                    floats: NDArray[np.float64],
                    masks: NDArray[np.uint64]) -> int:  # pragma: no cover - compiled
    """The match masks of rows [r0, r1) of one chunk's block against the intervals (as
    `interval_scan` takes them), 64 rows a mask from masks[0]; returns how many masks.
    O((r1 - r0) x intervals)."""
    groups = (r1 - r0 + 63) // 64
    masks[:groups] = ~np.uint64(0)
    for j in range(ints.shape[1]):
        row = block[ints[0, j]]
        if ints[1, j]:
            _and_within(row.view(np.float64), floats[0, j], floats[1, j], r0, r1, masks)
        else:
            _and_within(row.view(np.int64), ints[2, j], ints[3, j], r0, r1, masks)
    return groups


@_njit(cache=True, nogil=True, boundscheck=False, inline="always")
def _chunk_matches(block: NDArray[np.uint64], base: int, p0: int, p1: int, cap: int,
                   ints: NDArray[np.int64], floats: NDArray[np.float64],
                   masks: NDArray[np.uint64], out: NDArray[np.int64],
                   k: int) -> int:  # pragma: no cover - compiled
    """The positions in [p0, p1) of the chunk at `base` (its block `block`) whose
    values lie in the intervals, written to out from k on; returns the new k."""
    one = np.uint64(1)
    r0 = max(p0 - base, 0)
    found = _interval_masks(block, r0, min(p1 - base, cap), ints, floats, masks)
    for q in range(found):
        m = masks[q]
        p = base + r0 + 64 * q
        while m:
            out[k] = p + np.int64(_trailing_zeros(m))
            k += 1
            m &= m - one
    return k


@_njit(cache=True, nogil=True, boundscheck=False)
def _interval_scan(blocks: NDArray[np.int64], k_first: int, cap: int, p0: int, p1: int,
                   ints: NDArray[np.int64], floats: NDArray[np.float64],
                   out: NDArray[np.int64]) -> int:  # pragma: no cover
    """The positions p0 <= p < p1 of a chunked store (chunk k's block is
    blocks[k - k_first], as in `chunk_gather`) whose value in block row ints[0, j] lies
    in [lo, hi] for every j: as int64 [ints[2, j], ints[3, j]] or, where ints[1, j] is
    1, as float64 [floats[0, j], floats[1, j]] (NaN lies in no interval). Written to out
    (room for p1 - p0); returns how many.
    Per chunk, each interval's tests go 64 rows into one match mask (a vectorized loop),
    ANDed into the chunk's masks; the matches are then written by trailing-zero counts.
    O((p1 - p0) x intervals) tests, O(matches) writes."""
    masks = np.empty((cap + 63) // 64, np.uint64)
    k = 0
    if p1 <= p0:
        return 0
    for c in range(p0 // cap, (p1 - 1) // cap + 1):
        k = _chunk_matches(_chunk_at(blocks, c - k_first), c * cap, p0, p1, cap, ints,
                           floats, masks, out, k)
    return k


def _vector_compress(context: Any) -> bool:
    """Whether the code `context` compiles has AVX-512's register compress
    (`vpcompressq`): its target's features name avx512f. A target named by CPU alone
    (NUMBA_CPU_NAME with empty NUMBA_CPU_FEATURES) counts as without: slower, never
    wrong."""
    features = str(getattr(context.codegen(), "_tm_features", ""))
    return "+avx512f" in features.split(",")


@_intrinsic
def _compress8(typingctx: Any, src: Any, i: Any, bits: Any, dst: Any,
               k: Any) -> Any:  # pragma: no cover - compiled
    """dst[k], dst[k + 1], ... = src[i + b] for each set bit b of the low 8 of `bits`,
    in order, writing dst[k:k + 8] (past the copied values: the caller guarantees
    dst[k:k + 8] exists and that what it holds past them is written again later).
    With AVX-512, an 8-value load, a compress in registers and one whole 8-value store.
    Not the compress-store to memory (`llvm.masked.compressstore`): Zen 4 microcodes
    that form (a 16.6K-row invoke 0.55 ms rather than 0.065), and without AVX-512 LLVM
    expands it into a branch per value. Without AVX-512, eight loads and eight stores,
    each value stored at dst[k + the set bits below it]: no branch (LLVM's own
    expansion of a register compress goes through the stack, 2x slower here).
    The caller guarantees src[i:i + 8] exists."""
    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        src_ty, _, _, dst_ty, _ = signature.args
        src_v = context.make_array(src_ty)(context, builder, args[0])
        dst_v = context.make_array(dst_ty)(context, builder, args[3])
        word = ir.IntType(64)
        intp = context.get_value_type(types.intp)
        where = cgutils.get_item_pointer(context, builder, src_ty, src_v, [args[1]],
                                         wraparound=False)
        to = cgutils.get_item_pointer(context, builder, dst_ty, dst_v, [args[4]],
                                      wraparound=False)
        if _vector_compress(context):
            vec = ir.VectorType(word, 8)
            lanes = ir.VectorType(ir.IntType(1), 8)
            values = builder.load(builder.bitcast(where, vec.as_pointer()), align=8)
            mask = builder.bitcast(builder.trunc(args[2], ir.IntType(8)), lanes)
            compress = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(vec, [vec, lanes, vec]),
                "llvm.experimental.vector.compress.v8i64")
            packed = builder.call(compress, [values, mask, ir.Constant(vec, ir.Undefined)])
            builder.store(packed, builder.bitcast(to, vec.as_pointer()), align=8)
            return context.get_dummy_value()
        src_words = builder.bitcast(where, word.as_pointer())
        dst_words = builder.bitcast(to, word.as_pointer())
        at = ir.Constant(intp, 0)
        for b in range(8):
            value = builder.load(builder.gep(src_words, [ir.Constant(intp, b)]), align=8)
            builder.store(value, builder.gep(dst_words, [at]), align=8)
            bit = builder.and_(builder.lshr(args[2], ir.Constant(word, b)), ir.Constant(word, 1))
            at = builder.add(at, bit if intp.width == 64 else builder.trunc(bit, intp))
        return context.get_dummy_value()
    return types.void(src, types.intp, types.uint64, dst, types.intp), codegen


@_intrinsic
def _compress_from(typingctx: Any) -> Any:  # pragma: no cover - compiled
    """Above this many matches in 64 rows, a column's values are copied eight at a time
    (`_compress8`) rather than one by one, a constant of the target: with AVX-512 8
    (measured, 6 columns over a 32K-row window: thresholds 8 and 16 alike, 4 slower at
    7% density); without, where eight values cost eight stores whatever their matches,
    `_COMPRESS_SCALAR`."""
    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        threshold = 8 if _vector_compress(context) else _COMPRESS_SCALAR
        return ir.Constant(context.get_value_type(types.intp), threshold)
    return types.intp(), codegen


#: `_compress_from` without AVX-512 (measured on this machine's CPU compiled for
#: haswell, 6 columns over a 64K-row window, against the compress-store LLVM expands
#: into a branch per value: 1.4x faster at 25% density, 3.6x at 50%, 0.9x at 90%;
#: thresholds 8 and 40 slower at 25% and 50% respectively).
_COMPRESS_SCALAR = 24


@_njit(cache=True, nogil=True, boundscheck=False)
def _chunk_select(chunks: NDArray[np.int64], k_first: int, p0: int, p1: int, word: int,
                  mask: np.uint64, sealed: int, blocks: NDArray[np.int64], b_first: int,
                  cap: int, rows_of: NDArray[np.int64], positions: NDArray[np.int64]
                  ) -> tuple[NDArray[np.uint64], NDArray[np.uint64]]:  # pragma: no cover
    """The find and the fetch of an invocation in one call: for the positions
    p0 <= p < p1 of a chunked bitmap whose bit (`word`, `mask`) is set (chunk k is
    chunks[k - k_first], as in `chunk_positions`), the values of block rows `rows_of`
    of a chunked store (chunk k's block is blocks[k - b_first], as in `chunk_gather`),
    as a new (len(rows_of), matches) array (sealed rows made SLICED first, as in
    `chunk_positions`); the positions themselves are written to
    `positions` unless it is empty (else it must hold p1 - p0). Returns (values, the
    match masks): `marked_copy` takes more columns through the masks later, without
    the find.

    Per chunk, the match masks of its rows are made 64 rows at a time (as in
    `word_positions`), then each column is copied through them (`_copy_marked`).
    Measured, 6 columns of a 32K window, against `chunk_positions` then
    `chunk_gather`: 1.5-1.7x faster at 25-96% density, as fast at 1-9%. O(p1 - p0) word
    tests plus O(columns x (p1 - p0) / 8) eight-value copies at most, or
    O(columns x matches)."""
    one = np.uint64(1)
    zero = np.uint64(0)
    start = np.int64(_trailing_zeros(mask)) * (cap // 64)
    c0 = p0 // cap
    c1 = (p1 - 1) // cap + 1 if p1 > p0 else c0
    masks = np.empty((max(c1 - c0, 0), (cap + 63) // 64), np.uint64)
    for c in range(c0, c1):
        m_row = masks[c - c0]
        m_row[:] = zero
        i = c - k_first
        b = c - b_first
        if i < 0 or i >= chunks.shape[0] or chunks[i, 1] <= word or b < 0 or \
                b >= blocks.shape[0]:
            continue                    # no bitmap or no data there: no matches
        bits = _ready(_chunk_at(chunks, i), word, c, cap, sealed)
        r0 = max(p0 - c * cap, 0)
        r1 = min(p1 - c * cap, cap)
        r = r0
        q = 0
        if bits[cap] == SLICED:
            while r < r1:
                m_row[q] = _sliced_mask(bits, start, r, r1)
                q += 1
                r += 64
        while r < r1:
            m = zero
            if r + 64 <= r1:
                run = bits[r:r + 64]
                for t in range(64):
                    m |= (one << np.uint64(t)) if (run[t] & mask) != zero else zero
            else:
                run = bits[r:r1]        # (not bits[r + t]: LLVM gathers that)
                for t in range(r1 - r):
                    m |= (one << np.uint64(t)) if (run[t] & mask) != zero else zero
            m_row[q] = m
            q += 1
            r += 64
    return _copy_marked(masks, p0, p1, blocks, b_first, cap, rows_of, positions), masks


@_njit(cache=True, nogil=True, boundscheck=False)
def _marked_copy(masks: NDArray[np.uint64], p0: int, p1: int, blocks: NDArray[np.int64],
                 b_first: int, cap: int,
                 rows_of: NDArray[np.int64]) -> NDArray[np.uint64]:  # pragma: no cover
    """The values of block rows `rows_of` at the matches `chunk_select` found (its
    masks, for the same p0, p1 and cap), as a new (len(rows_of), matches) array.
    O(columns x (p1 - p0) / 8) eight-value copies at most, or O(columns x matches)."""
    return _copy_marked(masks, p0, p1, blocks, b_first, cap, rows_of,
                        np.empty(0, np.int64))


@_njit(cache=True, nogil=True, boundscheck=False, inline="always")
def _marked_positions(m_row: NDArray[np.uint64], n_masks: int, base: int,
                      positions: NDArray[np.int64],
                      k: int) -> None:  # pragma: no cover - compiled
    """positions[k], positions[k + 1], ... = base + r for each set bit r of the 64-row
    masks m_row[:n_masks] (mask q's bit t: row 64 q + t), in order. O(matches)."""
    one = np.uint64(1)
    end = k
    for q in range(n_masks):
        m = m_row[q]
        at = base + 64 * q
        while m:
            positions[end] = at + np.int64(_trailing_zeros(m))
            end += 1
            m &= m - one


@_njit(cache=True, nogil=True, boundscheck=False)
def _copy_marked(masks: NDArray[np.uint64], p0: int, p1: int, blocks: NDArray[np.int64],
                 b_first: int, cap: int, rows_of: NDArray[np.int64],
                 positions: NDArray[np.int64]) -> NDArray[np.uint64]:  # pragma: no cover
    """`chunk_select`'s copy: each column through the 64-row masks, eight values at a
    time (`_compress8`) for a dense 64 rows with 8 slots to spare after their values
    (sequential loads, no index per value), value by value otherwise; the positions
    too, into `positions` unless it is empty. A row's slots past the values copied so
    far are written in order later, so what `_compress8` leaves there is overwritten."""
    one = np.uint64(1)
    low8 = np.uint64(255)
    c0 = p0 // cap
    dense = _compress_from()
    total = 0
    for i in range(masks.shape[0]):
        for q in range(masks.shape[1]):
            total += np.int64(_ones(masks[i, q]))
    out = np.empty((len(rows_of), total), np.uint64)
    with_positions = len(positions) > 0
    k = 0
    for c in range(c0, c0 + masks.shape[0]):
        m_row = masks[c - c0]
        block = c - b_first
        if block < 0 or block >= blocks.shape[0]:
            continue                    # its masks are zero
        values = _chunk_at(blocks, block)
        r0 = max(p0 - c * cap, 0)
        r1 = min(p1 - c * cap, cap)
        n_masks = (r1 - r0 + 63) // 64
        for j in range(len(rows_of)):
            src = values[rows_of[j]]
            dst = out[j]
            end = k
            for q in range(n_masks):
                m = m_row[q]
                r = r0 + 64 * q
                count = np.int64(_ones(m))
                if count > dense and r + 64 <= cap and end + count + 8 <= total:
                    for e in range(8):
                        byte = (m >> np.uint64(8 * e)) & low8
                        _compress8(src, r + 8 * e, byte, dst, end)
                        end += np.int64(_ones(byte))
                else:
                    while m:
                        dst[end] = src[r + np.int64(_trailing_zeros(m))]
                        end += 1
                        m &= m - one
        if with_positions:
            _marked_positions(m_row, n_masks, c * cap + r0, positions, k)
        for q in range(n_masks):
            k += np.int64(_ones(m_row[q]))
    return out


@_njit(cache=True, nogil=True, boundscheck=False)
def write_column(table: NDArray[np.uint64], cell_row: NDArray[np.int64], word: int,
                 mask: np.uint64,
                 accepts: NDArray[np.bool_]) -> None:  # pragma: no cover - compiled
    """table[cell_row[c], word] gets bit `mask` set where accepts[c] is False, cleared
    where it is True: a query's column of reject bits, O(cells)."""
    keep = ~mask
    for c in range(len(cell_row)):
        row = cell_row[c]
        value = table[row, word] & keep
        if not accepts[c]:
            value |= mask
        table[row, word] = value


@_njit(cache=True, nogil=True, boundscheck=False)
def fingerprint(values: NDArray[np.int64]) -> tuple[int, int]:  # pragma: no cover - compiled
    """Two 64-bit lanes that tell int64 sequences apart: each value and its index mixed
    by two different splitmix64 finalizers, the first lane their sum, the second their
    xor (mod 2**64), each with the length folded in. Not cryptographic: an accidental
    collision has odds about 2**-64. O(n), a few cycles per value (for `since` cursors'
    answer digests)."""
    s = np.uint64(0)
    x = np.uint64(0)
    for i in range(values.size):
        v = np.uint64(values.flat[i]) + np.uint64(i) * np.uint64(0x9E3779B97F4A7C15)
        a = (v ^ (v >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        a = (a ^ (a >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        s += a ^ (a >> np.uint64(31))
        b = (v ^ (v >> np.uint64(33))) * np.uint64(0xFF51AFD7ED558CCD)
        b = (b ^ (b >> np.uint64(33))) * np.uint64(0xC4CEB9FE1A85EC53)
        x ^= b ^ (b >> np.uint64(33))
    n = np.uint64(values.size)
    return s + n * np.uint64(0xD6E8FEB86659FD93), x ^ n


@_njit(cache=True, nogil=True, boundscheck=False)
def _clear_bit(chunks: NDArray[np.int64], cap: int, word: int,
               mask: np.uint64) -> None:  # pragma: no cover - compiled
    """Clear `mask` in word row `word` of every chunk of a chunked bitmap (as in
    `chunk_positions`; a chunk of `word` rows or fewer has no such bit and is skipped):
    one query's bits gone, in one call; in a SLICED row (see WORD_MAJOR) the slot's own
    cap / 64 words. O(chunks x cap), O(chunks x cap / 64) over SLICED rows."""
    keep = ~mask
    groups = cap // 64
    start = np.int64(_trailing_zeros(mask)) * groups
    for i in range(chunks.shape[0]):
        chunk = _chunk_at(chunks, i)
        if chunk.shape[0] > word:
            row = chunk[word]
            if row[cap] == SLICED:
                row[start:start + groups] = 0
            else:
                for j in range(cap):
                    row[j] &= keep


@_njit(cache=True, nogil=True, boundscheck=False)
def _set_bits(chunks: NDArray[np.int64], k_first: int, cap: int, word: int, mask: np.uint64,
              positions: NDArray[np.int64]) -> None:  # pragma: no cover - compiled
    """Set `mask` in word row `word` at each of the sorted positions p of a chunked bitmap
    (chunk k is chunks[k - k_first], as in `chunk_positions`): row `word` of chunk
    p // cap, column p % cap, a chunk the caller made wide enough; in a SLICED row the
    slot's own cap / 64 words. A new query's matches, in one call (its slot has no bit
    set before: nothing is cleared). O(len(positions))."""
    one = np.uint64(1)
    start = np.int64(_trailing_zeros(mask)) * (cap // 64)
    n = len(positions)
    i = 0
    while i < n:
        k = positions[i] // cap
        row = _chunk_at(chunks, k - k_first)[word]
        base = k * cap
        sliced = row[cap] == SLICED
        while i < n and positions[i] < base + cap:
            r = positions[i] - base
            if sliced:
                row[start + (r >> 6)] |= one << np.uint64(r & 63)
            else:
                row[r] |= mask
            i += 1



# The kernels that walk chunks, at the package boundary: the compiled dispatchers
# themselves (a Python wrapper reading AddressTable.table would add ~115 ns to a call
# of ~450), typed to take the table's `handle`, which under this backend is its int64
# table. The signatures match the numpy twins'.

chunk_positions = cast("Callable[[Handle, int, int, int, int, int, np.uint64, int, "
                       "NDArray[np.int64]], int]", _chunk_positions)
chunk_gather = cast("Callable[[Handle, int, int, NDArray[np.int64], NDArray[np.int64], "
                    "NDArray[np.uint64]], None]", _chunk_gather)
interval_scan = cast("Callable[[Handle, int, int, int, int, NDArray[np.int64], "
                     "NDArray[np.float64], NDArray[np.int64]], int]", _interval_scan)
chunk_select = cast("Callable[[Handle, int, int, int, int, np.uint64, int, Handle, int, int, "
                    "NDArray[np.int64], NDArray[np.int64]], "
                    "tuple[NDArray[np.uint64], NDArray[np.uint64]]]", _chunk_select)
marked_copy = cast("Callable[[NDArray[np.uint64], int, int, Handle, int, int, "
                   "NDArray[np.int64]], NDArray[np.uint64]]", _marked_copy)
clear_bit = cast("Callable[[Handle, int, int, np.uint64], None]", _clear_bit)
set_bits = cast("Callable[[Handle, int, int, int, np.uint64, NDArray[np.int64]], None]",
                _set_bits)


@_njit(cache=True, nogil=True, boundscheck=False, inline="always")
def _run_end(positions: NDArray[np.int64], i: int, end: int) -> int:  # pragma: no cover
    """The index past the sorted positions from i on that lie below `end`: with `end`
    the end of positions[i]'s chunk, the end of its run of that chunk."""
    n = len(positions)
    while i < n and positions[i] < end:
        i += 1
    return i


@_njit(cache=True, nogil=True, boundscheck=False)
def _chunk_key_range(blocks: NDArray[np.int64], k_first: int, cap: int, row: int,
                     positions: NDArray[np.int64]) -> tuple[int, int]:  # pragma: no cover
    """(min, max) of the int64 values of block row `row` at the sorted `positions` of a
    chunked store (as in `chunk_gather`; (0, -1) for none). O(len(positions))."""
    n = len(positions)
    lo = np.int64(0)
    hi = np.int64(-1)
    if n:
        lo = hi = _chunk_at(blocks, positions[0] // cap - k_first)[row].view(
            np.int64)[positions[0] % cap]
    i = 0
    while i < n:
        c = positions[i] // cap
        values = _chunk_at(blocks, c - k_first)[row].view(np.int64)
        base = c * cap
        j0 = i
        i = _run_end(positions, i, base + cap)
        r0 = positions[j0] - base
        if positions[i - 1] - base - r0 == i - 1 - j0:      # a contiguous run
            lo = min(lo, values[r0:r0 + i - j0].min())
            hi = max(hi, values[r0:r0 + i - j0].max())
            continue
        for t in range(j0, i):
            v = values[_opaque(positions[t] - base)]
            lo = min(lo, v)
            hi = max(hi, v)
    return lo, hi


@_njit(cache=True, nogil=True, boundscheck=False)
def _chunk_key_counts(blocks: NDArray[np.int64], k_first: int, cap: int, row: int,
                      positions: NDArray[np.int64], lo: int,
                      counts: NDArray[np.int64]) -> int:  # pragma: no cover - compiled
    """counts[v - lo] += 1 for the int64 value v of block row `row` at each sorted
    position within [lo, lo + len(counts)): the group sizes of a GROUP BY on a small
    INT range, read in place. Returns how many values lay outside (not counted), so
    that a table placed by a guess, without `chunk_key_range`'s pass, can be checked.
    O(len(positions))."""
    n = len(positions)
    size = np.uint64(len(counts))
    outside = 0
    i = 0
    while i < n:
        c = positions[i] // cap
        values = _chunk_at(blocks, c - k_first)[row].view(np.int64)
        base = c * cap
        j0 = i
        i = _run_end(positions, i, base + cap)
        r0 = positions[j0] - base
        if positions[i - 1] - base - r0 == i - 1 - j0:      # a contiguous run
            for r in range(r0, r0 + i - j0):
                k = values[r] - lo
                if np.uint64(k) < size:
                    counts[k] += 1
                else:
                    outside += 1
            continue
        for t in range(j0, i):
            k = values[positions[t] - base] - lo
            if np.uint64(k) < size:
                counts[k] += 1
            else:
                outside += 1
    return outside


@_njit(cache=True, nogil=True, boundscheck=False)
def _scatter_run(block: NDArray[np.uint64], keys: NDArray[np.int64], by_position: bool,
                 rows_of: NDArray[np.int64], positions: NDArray[np.int64], j0: int, j1: int,
                 base: int, lo: int, remap: NDArray[np.int64], cursors: NDArray[np.int64],
                 dst: NDArray[np.uint64]) -> None:  # pragma: no cover - compiled
    """The positions [j0, j1) of one chunk, and its rows rows_of there, each to the
    next column of its group (its key keys[positions[t] - base], a chunk's key row, or
    keys[t]), every column of a tuple written at once by plain stores: to many groups'
    columns at a time, streaming stores (one line buffer per destination) or a loop
    per column were slower (measured, 4M tuples in 8 groups, positions and one column:
    10.4 ms, against 12.5 ms a loop per column by streaming stores, 28.5 ms both at
    once by streaming stores)."""
    out = dst[0]
    rows = len(rows_of)
    for t in range(j0, j1):
        p = positions[t]
        g = remap[(keys[p - base] if by_position else keys[t]) - lo]
        d = cursors[g]
        cursors[g] = d + 1
        out[d] = np.uint64(p)
        for r in range(rows):
            dst[1 + r, d] = block[rows_of[r], p - base]


@_njit(cache=True, nogil=True, boundscheck=False)
def _copy_run(block: NDArray[np.uint64], rows_of: NDArray[np.int64],
              positions: NDArray[np.int64], j0: int, j1: int, base: int, at: int,
              dst: NDArray[np.uint64]) -> None:  # pragma: no cover - compiled
    """The positions [j0, j1) of one chunk and its rows rows_of there into the columns
    at + t of dst (one run), by streaming stores, a loop per column (the copies are
    read at invocations, not now; measured, a 96 MB copy: 7.3 ms where plain stores
    took 9.3)."""
    out = dst[0]
    for t in range(j0, j1):
        _stream_store(out, at + t, np.uint64(positions[t]))
    for r in range(len(rows_of)):
        src = block[rows_of[r]]
        out = dst[1 + r]
        for t in range(j0, j1):
            _stream_store(out, at + t, src[positions[t] - base])


@_njit(cache=True, nogil=True, boundscheck=False)
def _chunk_scatter(blocks: NDArray[np.int64], k_first: int, cap: int,
                   rows_of: NDArray[np.int64], positions: NDArray[np.int64], key_row: int,
                   keys: NDArray[np.int64], lo: int, remap: NDArray[np.int64],
                   cursors: NDArray[np.int64],
                   dst: NDArray[np.uint64]) -> None:  # pragma: no cover - compiled
    """`chunk_gather` and a stable counting sort by group in one pass: the tuple at
    sorted position positions[i] (chunk k's block being blocks[k - k_first]) goes to
    column j = cursors[g] of `dst`, g = remap[key - lo], and cursors[g] moves on by
    one; the key is the int64 value of block row `key_row` there when key_row >= 0,
    else keys[i], and every tuple is in group 0 when `keys` is empty too. dst[0, j] is
    the position, dst[1 + r, j] the value of block row rows_of[r]. A group keeps its
    tuples in position order. One group's chunk run is one run of columns, copied by
    `_copy_run`; tuples of several groups are spread by `_scatter_run`.
    O((1 + len(rows_of)) x len(positions))."""
    n = len(positions)
    one_group = key_row < 0 and len(keys) == 0
    i = 0
    while i < n:
        c = positions[i] // cap
        block = _chunk_at(blocks, c - k_first)
        base = c * cap
        j0 = i
        i = _run_end(positions, i, base + cap)
        if one_group:               # one run of destinations: plain copies
            at = cursors[0] - j0
            cursors[0] += i - j0
            _copy_run(block, rows_of, positions, j0, i, base, at, dst)
        elif key_row >= 0:
            _scatter_run(block, block[key_row].view(np.int64), True, rows_of, positions, j0,
                         i, base, lo, remap, cursors, dst)
        else:
            _scatter_run(block, keys, False, rows_of, positions, j0, i, base, lo, remap,
                         cursors, dst)
    _store_fence()


@_njit(cache=True, nogil=True, boundscheck=False)
def _interval_gather(blocks: NDArray[np.int64], k_first: int, cap: int, p0: int, p1: int,
                     ints: NDArray[np.int64], floats: NDArray[np.float64],
                     rows_of: NDArray[np.int64],
                     out: NDArray[np.uint64]) -> int:  # pragma: no cover - compiled
    """`interval_scan` and `chunk_gather` in one pass: for each position p0 <= p < p1
    whose values lie in the intervals (as `interval_scan` takes them), out[0, k] = p
    and out[1 + r, k] = its value of block row rows_of[r], k counting the matches from
    0 (out has room for p1 - p0); returns how many. Each chunk's rows are read while
    still in the cache from its tests. O((p1 - p0) x intervals + matches x rows)."""
    one = np.uint64(1)
    masks = np.empty((cap + 63) // 64, np.uint64)
    k = 0
    if p1 <= p0:
        return 0
    for c in range(p0 // cap, (p1 - 1) // cap + 1):
        block = _chunk_at(blocks, c - k_first)
        base = c * cap
        r0 = max(p0 - base, 0)
        r1 = min(p1 - base, cap)
        groups = _interval_masks(block, r0, r1, ints, floats, masks)
        k0 = k
        positions = out[0]
        for q in range(groups):
            m = masks[q]
            p = base + r0 + 64 * q
            while m:
                positions[k] = np.uint64(p + np.int64(_trailing_zeros(m)))
                k += 1
                m &= m - one
        for r in range(len(rows_of)):
            src = block[rows_of[r]]
            dst = out[1 + r]
            for t in range(k0, k):
                dst[t] = src[np.int64(positions[t]) - base]
    return k



def _step(s: Any, e: Any, v: Any) -> Any:  # pragma: no cover - typed below
    """A running sum (s, e) after value v, as `block_fold` keeps one: only compiled
    code calls it."""
    raise NotImplementedError("compiled only")


@overload(_step, inline="always")
def _step_typed(s: Any, e: Any, v: Any) -> Any:  # pragma: no cover
    """`_step` for the sum's dtype: FLOAT one TwoSum step (s the running float64 sum,
    e the running sum of each step's rounding error), INT the two 32-bit halves (s the
    sum of v >> 32, e of v & (2**32 - 1))."""
    if isinstance(s, types.Float):
        def step_float(s: Any, e: Any, v: Any) -> Any:
            a = s + v
            part = a - s
            return a, e + ((s - (a - part)) + (v - part))
        return step_float

    def step_int(s: Any, e: Any, v: Any) -> Any:
        return s + (v >> 32), e + (v & 0xFFFFFFFF)
    return step_int


def _values_like(row: Any, like: Any) -> Any:  # pragma: no cover - typed below
    """A block row read as the dtype of `like`: only compiled code calls it."""
    raise NotImplementedError("compiled only")


@overload(_values_like, inline="always")
def _values_like_typed(row: Any, like: Any) -> Any:  # pragma: no cover
    if isinstance(like.dtype, types.Float):
        def as_float(row: Any, like: Any) -> Any:
            return row.view(np.float64)
        return as_float

    def as_int(row: Any, like: Any) -> Any:
        return row.view(np.int64)
    return as_int


@_njit(cache=True, nogil=True, boundscheck=False, inline="always")
def _flush_block(b: int, groups: int, counting: bool, summing: bool,
                 counts: NDArray[np.int64], local: NDArray[np.int64],
                 last: NDArray[np.int64], latest: NDArray[np.int64], sums: Any,
                 s: Any, e: Any) -> None:  # pragma: no cover - compiled
    """Add one block's running counts and sums (of the groups it had rows of) into its
    cells and zero them. A sum (s, e) joins its cell's (S, E) as S' = S + s rounded and
    E' = E + (the TwoSum error of that step) + e; for INT the error is 0, so each half
    adds to its half."""
    for g in range(groups):
        if not local[g]:
            continue
        if counting:
            counts[b, g] += local[g]
            last[b, g] = max(last[b, g], latest[g])
        local[g] = 0
        if summing:
            x = sums[b, g, 0]
            v = s[g]
            a = x + v
            part = a - x
            sums[b, g, 1] += (x - (a - part)) + (v - part)
            sums[b, g, 1] += e[g]
            sums[b, g, 0] = a
            s[g] = 0
            e[g] = 0


@_njit(cache=True, nogil=True, boundscheck=False, inline="always")
def _fold_keyed(positions: NDArray[np.int64], i: int, j: int, base: int,
                keys: NDArray[np.int64], lo: int, values: Any, b: int, counting: bool,
                summing: bool, low: bool, high: bool, local: NDArray[np.int64],
                latest: NDArray[np.int64], s: Any, e: Any, mins: Any,
                maxs: Any) -> int:  # pragma: no cover - compiled
    """`block_fold` of positions[i:j], one block's, into the per-group running values;
    returns how many had a key outside the groups (left out)."""
    groups = np.uint64(len(local))
    outside = 0
    for t in range(i, j):
        p = positions[t]
        r = _opaque(p - base)
        g = keys[r] - lo
        if np.uint64(g) >= groups:
            outside += 1
            continue
        local[g] += 1
        latest[g] = p
        if summing or low or high:
            v = values[r]
            if summing:
                s[g], e[g] = _step(s[g], e[g], v)
            if low and v < mins[b, g]:
                mins[b, g] = v
            if high and v > maxs[b, g]:
                maxs[b, g] = v
    return outside


@_njit(cache=True, nogil=True, boundscheck=False, inline="always")
def _fold_one(positions: NDArray[np.int64], i: int, j: int, base: int, values: Any,
              b: int, counting: bool, summing: bool, low: bool, high: bool,
              local: NDArray[np.int64], latest: NDArray[np.int64], s: Any, e: Any,
              mins: Any, maxs: Any) -> None:  # pragma: no cover - compiled
    """`_fold_keyed` of one group (no GROUP BY), its running values in registers."""
    count = local[0]
    at = latest[0]
    total = s[0]
    error = e[0]
    low_v = mins[b, 0] if low else values[0]      # (unused without MIN)
    high_v = maxs[b, 0] if high else values[0]
    for t in range(i, j):
        p = positions[t]
        v = values[_opaque(p - base)]
        count += 1
        at = p
        if summing:
            total, error = _step(total, error, v)
        low_v = min(low_v, v)
        high_v = max(high_v, v)
    local[0] = count
    latest[0] = at
    s[0] = total
    e[0] = error
    if low:
        mins[b, 0] = low_v
    if high:
        maxs[b, 0] = high_v

@_njit(cache=True, nogil=True, boundscheck=False, inline="always")
def _fold_run(positions: NDArray[np.int64], i: int, n: int, block: NDArray[np.uint64],
              base: int, cap: int, key_row: int, lo: int, value_row: int, log_b: int,
              b_first: int, groups: int, counts: NDArray[np.int64],
              last: NDArray[np.int64], sums: Any, mins: Any, maxs: Any,
              local: NDArray[np.int64], latest: NDArray[np.int64], s: Any,
              e: Any) -> int:  # pragma: no cover - compiled
    """`block_fold` of positions[i:n], all in the chunk at `base` whose block is
    `block`, block by block (each flushed to its cells); how many were left out."""
    counting = counts.shape[0] > 0
    summing = sums.shape[0] > 0
    low = mins.shape[0] > 0
    high = maxs.shape[0] > 0
    keys = block[max(key_row, 0)].view(np.int64)
    values = _values_like(block[max(value_row, 0)], sums)
    outside = 0
    while i < n:
        b = (positions[i] >> log_b) - b_first
        end = min(n, i + min(1 << log_b, cap))     # a block's positions, at most
        j = i + np.searchsorted(positions[i:end], min((b + b_first + 1) << log_b,
                                                      base + cap))
        if key_row >= 0:
            outside += _fold_keyed(positions, i, j, base, keys, lo, values, b, counting,
                                   summing, low, high, local, latest, s, e, mins, maxs)
        else:
            _fold_one(positions, i, j, base, values, b, counting, summing, low, high,
                      local, latest, s, e, mins, maxs)
        i = j
        _flush_block(b, groups, counting, summing, counts, local, last, latest, sums, s, e)
    return outside


@_njit(cache=True, nogil=True, boundscheck=False, inline="always")
def _running(groups: int, sums: Any) -> tuple[Any, Any, Any, Any]:  # pragma: no cover
    """A fold's per-group running values, zero: counts, latest positions, and the sum
    pairs in the sums' dtype."""
    return (np.zeros(groups, np.int64), np.zeros(groups, np.int64),
            np.zeros(groups, sums.dtype), np.zeros(groups, sums.dtype))


@_njit(cache=True, nogil=True, boundscheck=False)
def _block_fold(blocks: NDArray[np.int64], k_first: int, cap: int,
                positions: NDArray[np.int64], key_row: int, lo: int,
                value_row: int, log_b: int, b_first: int, groups: int,
                counts: NDArray[np.int64], last: NDArray[np.int64], sums: Any,
                mins: Any, maxs: Any) -> int:  # pragma: no cover - compiled
    """Fold the tuples at sorted `positions` into per-block, per-group cells and return
    how many were left out.

    The block of position p is (p >> log_b) - b_first (a block across chunks is folded
    chunk by chunk, its cells flushed after each); its group k - lo for its value k of
    INT block row `key_row` (group 0 for all when key_row < 0). A tuple whose group is
    not one of the first `groups` columns of the cells is left out and counted (0 when
    the caller's guess of the keys' range held).

    A cell array with no rows is skipped: counts[b, g] += 1 and last[b, g] raised to
    p (the latest position); with the value v of block row `value_row`, read as the dtype of
    `sums`, `mins` and `maxs` (all float64 or all int64): sums[b, g] += v, mins[b, g] /
    maxs[b, g] lowered / raised to v.

    Sums: FLOAT a pair, the float64 running sum and the running sum of each step's
    TwoSum error; INT the sums of v >> 32 and of v & (2**32 - 1), int64s that may
    wrap. Each block's rows in this call are summed per group from (0, 0) in position
    order, then added to the cell as `_flush_block` says (the numpy twin does the
    same steps in the same order). O(len(positions)), read in place; the per-group
    running counts and sums stay in arrays of the groups' size, written to the cells
    once per block."""
    n = len(positions)
    local, latest, s, e = _running(groups, sums)
    outside = 0
    i = 0
    while i < n:
        c = positions[i] // cap
        j = _run_end(positions, i, (c + 1) * cap)
        outside += _fold_run(positions, i, j, _chunk_at(blocks, c - k_first), c * cap, cap,
                             key_row, lo, value_row, log_b, b_first, groups, counts, last,
                             sums, mins, maxs, local, latest, s, e)
        i = j
    return outside


@_njit(cache=True, nogil=True, boundscheck=False)
def _interval_fold(blocks: NDArray[np.int64], k_first: int, cap: int, p0: int, p1: int,
                   ints: NDArray[np.int64], floats: NDArray[np.float64],
                   out: NDArray[np.int64], key_row: int, lo: int, value_row: int,
                   log_b: int, b_first: int, groups: int, counts: NDArray[np.int64],
                   last: NDArray[np.int64], sums: Any, mins: Any,
                   maxs: Any) -> tuple[int, int]:  # pragma: no cover - compiled
    """`interval_scan` of [p0, p1) into `out` and `block_fold` of its matches, chunk by
    chunk while the chunk is in the cache: (matches, those left out of the cells).
    Every match is written to `out`, left out or not. O((p1 - p0) x intervals)."""
    masks = np.empty((cap + 63) // 64, np.uint64)
    local, latest, s, e = _running(groups, sums)
    k = 0
    outside = 0
    if p1 <= p0:
        return 0, 0
    for c in range(p0 // cap, (p1 - 1) // cap + 1):
        block = _chunk_at(blocks, c - k_first)
        base = c * cap
        k0 = k
        k = _chunk_matches(block, base, p0, p1, cap, ints, floats, masks, out, k)
        outside += _fold_run(out, k0, k, block, base, cap, key_row, lo, value_row, log_b,
                             b_first, groups, counts, last, sums, mins, maxs, local, latest,
                             s, e)
    return k, outside


@_njit(cache=True, nogil=True, boundscheck=False)
def block_prefix(sums: NDArray[np.float64], start: NDArray[np.float64],
                 out: NDArray[np.float64]) -> None:  # pragma: no cover - compiled
    """out[b, g] = the compensated prefix (s, e) of FLOAT block sums sums[:b + 1, g]
    (each a pair as `block_fold` keeps it) from start[g]: s the running float64 sum of
    the blocks' s, e the running sum of each step's TwoSum error and the blocks' e.
    O(blocks x groups)."""
    for g in range(sums.shape[1]):
        s = start[g, 0]
        e = start[g, 1]
        for b in range(sums.shape[0]):
            v = sums[b, g, 0]
            a = s + v
            part = a - s
            e += (s - (a - part)) + (v - part)
            e += sums[b, g, 1]
            s = a
            out[b, g, 0] = s
            out[b, g, 1] = e


@_njit(cache=True, nogil=True, boundscheck=False)
def float_prefix(values: NDArray[np.float64], s0: float, e0: float,
                 out: NDArray[np.float64]) -> None:  # pragma: no cover - compiled
    """out[i] = (s, e) after values[:i + 1] from the prefix row (s0, e0): s the running
    sum as float64 rounds it step by step, e the running sum of each step's exact
    rounding error (Knuth's TwoSum), exactly as psoup.results.aggregates._extend_prefix
    computes it with numpy (the same operations in the same order). O(n), one pass."""
    before = s0
    err = e0
    for i in range(len(values)):
        v = values[i]
        after = before + v
        part = after - before
        err += (before - (after - part)) + (v - part)
        out[i, 0] = after
        out[i, 1] = err
        before = after
interval_gather = cast("Callable[[Handle, int, int, int, int, NDArray[np.int64], "
                       "NDArray[np.float64], NDArray[np.int64], NDArray[np.uint64]], int]",
                       _interval_gather)
chunk_key_range = cast("Callable[[Handle, int, int, int, NDArray[np.int64]], "
                       "tuple[int, int]]", _chunk_key_range)
chunk_key_counts = cast("Callable[[Handle, int, int, int, NDArray[np.int64], int, "
                        "NDArray[np.int64]], int]", _chunk_key_counts)
chunk_scatter = cast("Callable[[Handle, int, int, NDArray[np.int64], NDArray[np.int64], int, "
                     "NDArray[np.int64], int, NDArray[np.int64], NDArray[np.int64], "
                     "NDArray[np.uint64]], None]", _chunk_scatter)
interval_fold = cast("Callable[[Handle, int, int, int, int, NDArray[np.int64], "
                     "NDArray[np.float64], NDArray[np.int64], int, int, int, int, int, int, "
                     "NDArray[np.int64], NDArray[np.int64], NDArray[Any], NDArray[Any], "
                     "NDArray[Any]], tuple[int, int]]", _interval_fold)
block_fold = cast("Callable[[Handle, int, int, NDArray[np.int64], int, int, "
                  "int, int, int, int, NDArray[np.int64], NDArray[np.int64], NDArray[Any], "
                  "NDArray[Any], NDArray[Any]], int]", _block_fold)
