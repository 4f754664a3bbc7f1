// Residual add + RMSNorm on one GPU: the epilogue of all_reduce_rmsnorm's "unfused" algorithm,
// which runs sollat's AllReduce first (any algorithm `auto` picks, library handovers included) and
// then this kernel on its output. No scratch, no peers, no faults of its own: a faulted AllReduce
// leaves NaN in its output, which this kernel carries into every output.
//
// Per row of `hidden` elements (x = the AllReduce's output, already rounded to T):
//   r   = round_T( float(x) + float(residual) )
//   out = round_T( (float(r) * rstd) * float(weight) ),  rstd = 1 / sqrt(ss / hidden + eps)
// with exactly the fused kernel's arithmetic (sollat/rmsnorm_math.h), cut as its one-block rows:
// block b takes rows b, b + gridDim.x, ...; line (16 bytes of the row) l belongs to pass
// l / blockDim.x and thread l % blockDim.x. ss: per thread over its lines in pass order, then the
// warp's pairwise tree, then the same tree over the warps' sums padded with zeros to 32 warps. So
// rmsnorm.reference([x], residual, weight, eps, rmsnorm.unfused_geometry(...)) gives the bits.
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
  __shared__ float warp_sums[2][kWarpSize];  // by row parity, as in allreduce_rmsnorm.cu

  const int row_lines = (int)((hidden + kElems - 1) / kElems);
  const int threads = (int)blockDim.x;
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
    float ss = 0.0f;
    P kept;  // the last pass's r stays in registers for the normalisation
    for (int p = 0; p < passes; ++p) {
      const int line = p * threads + (int)threadIdx.x;
      if (line >= row_lines) continue;
      const P x = load_row(in, row, line);
      const P rin = load_row(res, row, line);
      P r;
#pragma unroll
      for (int e = 0; e < kElems; ++e) r.v[e] = from_acc<T>(add_rn(to_acc(x.v[e]), to_acc(rin.v[e])));
      store_row(res_out, row, line, r);
#pragma unroll
      for (int e = 0; e < kElems; ++e) {
        const float v = to_acc(r.v[e]);  // past the row's end: 0 + 0, adds nothing to ss
        ss = add_rn(ss, mul_rn(v, v));
      }
      kept = r;
    }
    const float mine = warp_tree_sum(ss);
    if (lane == 0) warp_sums[parity][warp] = mine;
    // Orders the warps' sums before every thread's read; the other parity's slots, read for the
    // previous row, are free again once every thread has passed this barrier.
    __syncthreads();
    const float total = warp_tree_sum(lane < threads / kWarpSize ? warp_sums[parity][lane] : 0.0f);
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
