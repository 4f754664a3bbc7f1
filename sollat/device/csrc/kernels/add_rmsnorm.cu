// Residual add + RMSNorm on one GPU: the epilogue of all_reduce_rmsnorm's "unfused" algorithm,
// which runs sollat's AllReduce first (any algorithm `auto` picks; library handovers included unless
// the communicator is batch-invariant) and then this kernel on its output; also
// rmsnorm_epilogue.add_rmsnorm on its own. No scratch, no peers, no faults of its own: a faulted
// AllReduce leaves NaN in its output, which this kernel carries into every output.
//
// Per row of `hidden` elements (x = the AllReduce's output s, already rounded to T), the arithmetic
// of sollat/rmsnorm_math.h, the fused kernels' (docs/design.md, "Arithmetic and batch invariance"):
//   r   = round_T( float(s) + float(residual) )
//   out = round_T( (float(r) * rstd) * float(weight) ),  rstd = 1 / sqrt(ss / hidden + eps)
// ss the pairwise tree over float(r_e)^2 zero-padded to a power of two. The same bits as the fused
// kernels for the same s, whatever the geometry: rmsnorm.reference.
//
// Launch (rmsnorm.unfused_geometry; decode rows are 1..512 of 4096..8192 elements, 8-32 KiB):
// * Grid (blocks, launch ranks). Launch rank y = blockIdx.y finds its tensors in the rank table
//   (collective.h RankTable), so one launch serves every virtual rank; block b takes rows b,
//   b + gridDim.x, ... of its rank (more rows than blocks only past rmsnorm.UNFUSED_MAX_GRID).
//   One row per block: a decode row is what one SM moves in about one memory latency, and a block
//   per row keeps as many rows in flight as the SMs hold blocks.
// * A row is 16-byte lines (load_pack / store_pack: one vector access when the line is whole and
//   aligned). Its lines form chunks of 32; warp w of W holds chunk (p * kSlots + s) * W + w in
//   slot s of pass p and lane l its line 32 * chunk + l, so every warp access is 512 contiguous
//   bytes. The host sizes the block (threads = 32 * ceil(chunks / kSlots), at most
//   kAddRmsnormMaxThreads) so that every decode row is one pass.
// * Loads: all of a pass's lines of x, the residual and the weight (3 * kSlots vector loads per
//   thread) are issued before any is used: a thread waits for one memory round trip per pass,
//   and the weight is in registers before rstd is known.
// * Before the PDL wait each thread asks L2 for its lines of the residual and the weight of its
//   first row (prefetch.global.L2 returns no data, so nothing is read before the wait; every read
//   comes after it and is served by L2, the point of coherence, with whatever the previous kernel
//   wrote). In a model those lines have left L2 since the previous layer; the prefetch overlaps
//   their fetch with the AllReduce's tail instead of adding it after.
// * The sum of squares: square_tree per line, warp_tree_sum per chunk (a warp's 32 lanes hold one
//   chunk per slot; the slots' butterflies interleaved, warp_tree_sums), lane 0 stores the chunk's
//   sum to shared memory, ONE __syncthreads per row, then every warp combines the row's chunk sums
//   by row_tree_sum: the same tree (rmsnorm_math.h), so the same bits.
// * The last pass's r and weight stay in registers for y. With several passes (rows longer than
//   kAddRmsnormMaxThreads * kSlots lines) an earlier pass's r is read back from residual_out (this
//   thread's own store, same address: program order) and its weight loaded again.
//
// Aliasing: out may be in and res_out may be res, within one launch rank (the host allows exactly
// these, and no rank's output may overlap another rank's tensors). Each line is read (x, residual)
// and written (r, then y) by one thread, its reads first, so in place is safe.
//
// Module defines: SOLLAT_T (float, sollat::bf16, sollat::f16), SOLLAT_TABLE_RANKS (1 for a
// Communicator, the rank cap for a VirtualCommunicator). Kernel: add_rmsnorm (abi.h
// SOLLAT_ADD_RMSNORM_PARAMS: the rank table of abi.ADD_RMSNORM_LISTS, then rows, hidden, eps's bits;
// a null fp8_out: no FP8 copy).
#include "sollat/rmsnorm_math.h"

using namespace sollat;

namespace {

// Lines of a row per thread and pass: abi.add_rmsnorm_slots (a pass of a full block covers
// kAddRmsnormPassElems elements: 4 lines of fp32, 2 of a 16-bit type), or the module define
// SOLLAT_ADD_RMSNORM_SLOTS (1, 2, 4; rmsnorm_epilogue.variant: the host's geometry uses the same
// count). Other slots: another number of warps per row for the same lines, the same bits (the
// row's tree does not depend on the cut: rmsnorm_math.h).
#ifdef SOLLAT_ADD_RMSNORM_SLOTS
constexpr int kSlots = SOLLAT_ADD_RMSNORM_SLOTS;
static_assert(kSlots == 1 || kSlots == 2 || kSlots == 4, "SOLLAT_ADD_RMSNORM_SLOTS: 1, 2 or 4");
#else
constexpr int kSlots = kAddRmsnormPassElems * (int)sizeof(SOLLAT_T) / (kLineBytes * kAddRmsnormMaxThreads);
static_assert(kSlots == 2 || kSlots == 4, "abi.add_rmsnorm_slots: 4 for fp32, 2 for 16-bit types");
#endif

// ss / hidden, correctly rounded (div.rn). With the module define SOLLAT_ADD_RMSNORM_POW2_MEAN=1 a
// power-of-two hidden multiplies by its reciprocal instead: 1 / 2^k is exact (hidden <=
// rmsnorm.MAX_HIDDEN), and x * 2^-k and x / 2^k are the same real number, so both correctly rounded
// operations give the same bits (subnormal results, Inf and NaN included) for one multiply
// instead of the division's subroutine.
__device__ __forceinline__ float mean_of(float total, u64 hidden) {
#if defined(SOLLAT_ADD_RMSNORM_POW2_MEAN) && SOLLAT_ADD_RMSNORM_POW2_MEAN
  if ((hidden & (hidden - 1)) == 0) {  // 2^-k from its exponent bits: no division at all
    const int k = 63 - __clzll((long long)hidden);
    return mul_rn(total, __uint_as_float((u32)(127 - k) << 23));
  }
#endif
  return div_rn(total, (float)hidden);
}
// Line `e0 / kElems` of a row of n elements: one vector access when kWhole (the caller checked
// that every line of the row is whole and aligned), else load_pack / store_pack's checks.
template <typename T, bool kWhole>
__device__ __forceinline__ Pack<T, kLineBytes> load_line(const T* row, u64 e0, u64 n, bool aligned) {
  if constexpr (kWhole) return *reinterpret_cast<const Pack<T, kLineBytes>*>(row + e0);
  else return load_pack<T, kLineBytes>(row, e0, n, aligned);
}
template <typename T, bool kWhole>
__device__ __forceinline__ void store_line(T* row, u64 e0, u64 n, bool aligned, const Pack<T, kLineBytes>& v) {
  if constexpr (kWhole) *reinterpret_cast<Pack<T, kLineBytes>*>(row + e0) = v;
  else store_pack<T, kLineBytes>(row, e0, n, aligned, v);
}

// The call's tensors for this launch rank, and the row's cut.
template <typename T>
struct RowArgs {
  const T* in;
  T* out;
  const T* res;
  T* res_out;
  const T* weight;
  unsigned char* q;  // null: no FP8 copy
  float scale;
  u64 hidden;
  float eps;
  int row_lines, n_chunks, warps, passes, lane, warp;
  __device__ __forceinline__ int chunk_of(int p, int s) const { return (p * kSlots + s) * warps + warp; }
};

// One row (elements base .. base + hidden - 1 of every row tensor), sums into chunk_sums.
// kWhole: every line of the row is whole and every row pointer 16-byte aligned.
template <typename T, bool kWhole>
__device__ __forceinline__ void add_rmsnorm_row(const RowArgs<T>& a, u64 base, u32* chunk_sums) {
  typedef Pack<T, kLineBytes> P;
  constexpr int kElems = P::kElems;
  const T* in = a.in + base;
  const T* res = a.res + base;
  T* res_out = a.res_out + base;
  T* out = a.out + base;
  const bool in_al = is_aligned(in, kLineBytes), res_al = is_aligned(res, kLineBytes);
  const bool rout_al = is_aligned(res_out, kLineBytes), out_al = is_aligned(out, kLineBytes);
  const bool w_al = is_aligned(a.weight, kLineBytes);
  P r[kSlots], w[kSlots];  // the last pass's r and weight, kept for the normalisation
  for (int p = 0; p < a.passes; ++p) {
    P x[kSlots];
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {  // every load of the pass first
      const int line = a.chunk_of(p, s) * kWarpSize + a.lane;
      // Whole rows load without a branch: a slot past the row's end loads line 0 again (in bounds,
      // never used). A load under a branch is unpacked (PRMT, one 16-bit register per element)
      // inside the branch, which waits for its data, so each slot's loads would wait for the
      // previous slot's: kSlots memory round trips instead of one.
      if (kWhole || line < a.row_lines) {
        const u64 e0 = (u64)(line < a.row_lines ? line : 0) * kElems;
        x[s] = load_line<T, kWhole>(in, e0, a.hidden, in_al);
        r[s] = load_line<T, kWhole>(res, e0, a.hidden, res_al);
        w[s] = load_line<T, kWhole>(a.weight, e0, a.hidden, w_al);
      }
    }
    float part[kSlots];  // each slot's line's square_tree (0 past the row's last line)
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      const int line = a.chunk_of(p, s) * kWarpSize + a.lane;
      part[s] = 0.0f;
      if (line < a.row_lines) {
#pragma unroll
        for (int e = 0; e < kElems; ++e) r[s].v[e] = add_residual<T>(x[s].v[e], r[s].v[e]);
        store_line<T, kWhole>(res_out, (u64)line * kElems, a.hidden, rout_al, r[s]);
        part[s] = square_tree(r[s]);  // past the row's end: +0 elements, +0 squares
      }
    }
    // Every slot's chunk sum in one set of butterflies (every lane: the pass loop is warp-uniform);
    // a slot past the row's last chunk sums zeros and is not stored.
    warp_tree_sums(part);
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      const int chunk = a.chunk_of(p, s);
      if (a.lane == 0 && chunk * kWarpSize < a.row_lines) chunk_sums[chunk] = __float_as_uint(part[s]);
    }
  }
  // Orders every warp's chunk sums before every thread's reads (shared memory, one block).
  __syncthreads();
  const float total = row_tree_sum(chunk_sums, a.n_chunks);
  const float rstd = div_rn(1.0f, sqrt_rn(add_rn(mean_of(total, a.hidden), a.eps)));
  for (int p = 0; p < a.passes; ++p) {
    const bool last = p == a.passes - 1;
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      const int line = a.chunk_of(p, s) * kWarpSize + a.lane;
      if (line >= a.row_lines) continue;
      const u64 e0 = (u64)line * kElems;
      // An earlier pass's r: this thread's own store to res_out, same address (program order).
      const P rv = last ? r[s] : load_line<T, kWhole>(res_out, e0, a.hidden, rout_al);
      const P wv = last ? w[s] : load_line<T, kWhole>(a.weight, e0, a.hidden, w_al);
      P yv;
#pragma unroll
      for (int e = 0; e < kElems; ++e)
        yv.v[e] = from_acc<T>(mul_rn(mul_rn(to_acc(rv.v[e]), rstd), to_acc(wv.v[e])));
      store_line<T, kWhole>(out, e0, a.hidden, out_al, yv);
      if (a.q != nullptr) store_fp8<kElems>(a.q + base, e0, a.hidden, e4m3_word(yv, a.scale));
    }
  }
}

template <typename T>
__device__ __forceinline__ void add_rmsnorm_rows(const RankTable<kListsRmsnormFp8>& ptrs, u64 rows, u64 hidden,
                                                 float eps) {
  constexpr int kElems = Pack<T, kLineBytes>::kElems;
  constexpr int kChunks = RmsnormChunks<T, kLineBytes>::value;  // chunks of a row of rmsnorm.MAX_HIDDEN
  static_assert(kChunks <= kRmsnormMaxChunks && kChunks >= kQuadChunks, "both combines cover their rows");
  // By row parity: [c] = chunk c's sum. A row's slots are read after its barrier while faster warps
  // may already store the next row's, into the other parity; a parity's slots are stored again only
  // after the next row's barrier, which every warp passes after its reads.
  __shared__ __align__(16) u32 chunk_sums[2][kChunks];

  const int y = launch_rank();
  RowArgs<T> a;
  a.in = reinterpret_cast<const T*>(ptrs.at(kListIn, y));
  a.out = reinterpret_cast<T*>(ptrs.at(kListOut, y));
  a.res = reinterpret_cast<const T*>(ptrs.at(kListRes, y));
  a.res_out = reinterpret_cast<T*>(ptrs.at(kListResOut, y));
  a.weight = reinterpret_cast<const T*>(ptrs.at(kListWeight, y));
  a.q = reinterpret_cast<unsigned char*>(ptrs.at(kListFp8Out, y));
  const float* fp8_scale = reinterpret_cast<const float*>(ptrs.at(kListFp8Scale, y));
  a.hidden = hidden;
  a.eps = eps;
  a.row_lines = (int)((hidden + kElems - 1) / kElems);
  a.n_chunks = (a.row_lines + kWarpSize - 1) / kWarpSize;
  a.warps = (int)blockDim.x / kWarpSize;  // blockDim.x: a multiple of 32 (rmsnorm.unfused_geometry)
  a.passes = (a.n_chunks + a.warps * kSlots - 1) / (a.warps * kSlots);
  a.lane = (int)threadIdx.x & (kWarpSize - 1);
  a.warp = (int)threadIdx.x / kWarpSize;

  if (blockIdx.x < rows) {  // before the wait: L2 prefetches only (see the header)
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      const int line = a.chunk_of(0, s) * kWarpSize + a.lane;
      if (line < a.row_lines) {
        prefetch_l2(a.res + (u64)blockIdx.x * hidden + (u64)line * kElems);
        prefetch_l2(a.weight + (u64)line * kElems);
      }
    }
  }
  // Everything the previous kernel (the AllReduce) wrote is complete and visible after this.
  pdl_wait();
  a.scale = a.q != nullptr ? *fp8_scale : 0.0f;  // after the wait: a graph replay sees its value
  // Whole and aligned lines in every row: hidden a multiple of a line and every base 16-byte aligned.
  const bool whole = hidden % kElems == 0 &&
                     is_aligned(a.in, kLineBytes) && is_aligned(a.out, kLineBytes) && is_aligned(a.res, kLineBytes) &&
                     is_aligned(a.res_out, kLineBytes) && is_aligned(a.weight, kLineBytes);
  int parity = 0;
  for (u64 row = blockIdx.x; row < rows; row += gridDim.x, parity ^= 1) {
    if (whole) add_rmsnorm_row<T, true>(a, row * hidden, chunk_sums[parity]);
    else add_rmsnorm_row<T, false>(a, row * hidden, chunk_sums[parity]);
  }
}

}  // namespace

extern "C" __global__ void __launch_bounds__(sollat::kAddRmsnormMaxThreads, 1)
add_rmsnorm(SOLLAT_ADD_RMSNORM_PARAMS) {
  // PDL: the next kernel may launch now (it waits for this grid before touching memory); this one
  // reads nothing before the AllReduce that wrote `in` has completed (add_rmsnorm_rows: pdl_wait).
  sollat::pdl_launch_dependents();
  typedef SOLLAT_T T;
  add_rmsnorm_rows<T>(ptrs, rows, hidden, sollat::bit_cast<float>(eps_bits));
}
