// Residual add + RMSNorm on one GPU: the epilogue of all_reduce_rmsnorm's "unfused" algorithm,
// which runs sollat's AllReduce first (any algorithm `auto` picks; library handovers included unless
// the communicator is batch-invariant) and then this kernel on its output. No scratch, no peers, no
// faults of its own: a faulted AllReduce leaves NaN in its output, which this kernel carries into
// every output.
//
// Per row of `hidden` elements (x = the AllReduce's output s, already rounded to T), the arithmetic
// of sollat/rmsnorm_math.h, the fused kernel's (docs/design.md, "Arithmetic and batch invariance"):
//   r   = round_T( float(s) + float(residual) )
//   out = round_T( (float(r) * rstd) * float(weight) ),  rstd = 1 / sqrt(ss / hidden + eps)
// ss the pairwise tree over float(r_e)^2 zero-padded to a power of two, computed as: block b takes
// rows b, b + gridDim.x, ...; line (16 bytes of the row) l belongs to pass l / blockDim.x and thread
// l % blockDim.x; per line square_tree, per warp and pass warp_tree_sum over its 32 lines (chunk
// l / 32 of the row), each chunk's sum into shared memory, one barrier, then chunk_tree_sum in every
// warp. The same bits as the fused kernels for the same s, whatever the geometry: rmsnorm.reference.
//
// Aliasing: out may be in and res_out may be res (the host allows exactly these). Each line is
// read (x, residual) and written (r, then y) by one thread, the reads first, so in place is safe.
//
// Module define: SOLLAT_T (float, sollat::bf16, sollat::f16). Kernel: add_rmsnorm
// (abi.h SOLLAT_ADD_RMSNORM_PARAMS; fp8_out == 0: no FP8 copy).
#include "sollat/rmsnorm_math.h"

using namespace sollat;

namespace {

template <typename T>
__device__ __forceinline__ void add_rmsnorm_rows(const T* in, T* out, const T* res, T* res_out, const T* weight,
                                                 unsigned char* q, const float* fp8_scale, u64 rows, u64 hidden,
                                                 float eps) {
  typedef Pack<T, kLineBytes> P;
  constexpr int kElems = P::kElems;
  constexpr int kChunks = RmsnormChunks<T, kLineBytes>::value;  // chunks of a row of rmsnorm.MAX_HIDDEN
  static_assert(kChunks <= kRmsnormMaxChunks, "chunk_tree_sum covers the row");
  __shared__ u32 chunk_sums[2][kChunks];  // by row parity, as in allreduce_rmsnorm.cu: [c] = chunk c's sum

  const int row_lines = (int)((hidden + kElems - 1) / kElems);
  const int n_chunks = (row_lines + kWarpSize - 1) / kWarpSize;
  const int threads = (int)blockDim.x;  // a multiple of 32 (rmsnorm.unfused_geometry)
  const int passes = (row_lines + threads - 1) / threads;  // as rmsnorm.unfused_geometry
  const int lane = (int)threadIdx.x & (kWarpSize - 1);
  const int warp = (int)threadIdx.x / kWarpSize;
  const float scale = q != nullptr ? *fp8_scale : 0.0f;  // after pdl_wait: a graph replay sees its value

  auto load_row = [&](const T* base, u64 row, int line) {
    const T* r = base + row * hidden;
    return load_pack<T, kLineBytes>(r, (u64)line * kElems, hidden, is_aligned(r, kLineBytes));
  };
  auto store_row = [&](T* base, u64 row, int line, const P& v) {
    T* r = base + row * hidden;
    store_pack<T, kLineBytes>(r, (u64)line * kElems, hidden, is_aligned(r, kLineBytes), v);
  };

  int parity = 0;
  for (u64 row = blockIdx.x; row < rows; row += gridDim.x, parity ^= 1) {
    P kept;  // the last pass's r stays in registers for the normalisation
    for (int p = 0; p < passes; ++p) {
      const int line = p * threads + (int)threadIdx.x;
      float part = 0.0f;  // the line's square_tree (0 past the row's last line)
      if (line < row_lines) {
        const P x = load_row(in, row, line);
        const P rin = load_row(res, row, line);
        P r;
#pragma unroll
        for (int e = 0; e < kElems; ++e) r.v[e] = add_residual<T>(x.v[e], rin.v[e]);
        store_row(res_out, row, line, r);
        part = square_tree(r);  // past the row's end: +0 elements, +0 squares
        kept = r;
      }
      // Chunk (p * threads) / 32 + warp: the same in every lane, so the whole warp joins the butterfly.
      const int first = p * threads + warp * kWarpSize;
      if (first < row_lines) {
        const float sum = warp_tree_sum(part);
        if (lane == 0) chunk_sums[parity][first / kWarpSize] = __float_as_uint(sum);
      }
    }
    // Orders every warp's chunk sums before every thread's reads; the other parity's slots, read for
    // the previous row, are free again once every thread has passed this barrier (they are written
    // again only after the next row's barrier).
    __syncthreads();
    const float total = chunk_tree_sum(chunk_sums[parity], n_chunks);
    const float rstd = div_rn(1.0f, sqrt_rn(add_rn(div_rn(total, (float)hidden), eps)));
    for (int p = 0; p < passes; ++p) {
      const int line = p * threads + (int)threadIdx.x;
      if (line >= row_lines) continue;
      // Earlier passes read back what this thread stored into res_out (same thread, same address:
      // program order); the last one is still in registers.
      const P r = p == passes - 1 ? kept : load_row(res_out, row, line);
      const P w = load_row(weight, 0, line);
      P y;
#pragma unroll
      for (int e = 0; e < kElems; ++e) y.v[e] = from_acc<T>(mul_rn(mul_rn(to_acc(r.v[e]), rstd), to_acc(w.v[e])));
      store_row(out, row, line, y);
      if (q != nullptr) store_fp8<kElems>(q + row * hidden, (u64)line * kElems, hidden, e4m3_word(y, scale));
    }
  }
}

}  // namespace

extern "C" __global__ void __launch_bounds__(sollat::kAddRmsnormMaxThreads, 1)
add_rmsnorm(SOLLAT_ADD_RMSNORM_PARAMS) {
  // PDL: the next kernel may launch now (it waits for this grid before touching memory); this
  // one touches nothing before the AllReduce that wrote `in` has completed and is visible.
  sollat::pdl_launch_dependents();
  sollat::pdl_wait();
  typedef SOLLAT_T T;
  add_rmsnorm_rows<T>((const T*)in, (T*)out, (const T*)res, (T*)res_out, (const T*)weight, (unsigned char*)fp8_out,
                      fp8_scale, rows, hidden, sollat::bit_cast<float>(eps_bits));
}
