// sollat/rmsnorm_math.h - the arithmetic of the fused AllReduce + residual add + RMSNorm
// (kernels/allreduce_rmsnorm.cu) and of its one-GPU epilogue (kernels/add_rmsnorm.cu), stated once
// so that both compute the same bits whatever their launch geometry: single-rounding float ops, the
// residual add, the sum of squares as one pairwise tree over the row, the FP8 copy.
//
// Per row of `hidden` elements (docs/design.md, "Arithmetic and batch invariance"; sollat/collectives/rmsnorm.py
// `reference` replays it on the host):
//   s  = round_T(x_0 + x_1 + ... + x_{R-1})        rank-order fp32 sum (every sollat AllReduce's)
//   r  = round_T(float(s) + float(residual))        add_residual: two roundings (one for fp32)
//   ss = the pairwise tree over float(r_e)^2, e = 0 .. hidden-1, zero-padded to a power of two
//   rstd = 1 / sqrt(ss / hidden + eps);  y = round_T((float(r) * rstd) * float(weight))
// Every square is >= +0 (or +Inf, or NaN), and x + (+0) == x bitwise for such x, so padding the
// tree with zeros to ANY power of two gives the same bits: a pack of a power-of-two number of
// elements at an aligned offset is a subtree (square_tree), 32 consecutive packs held by one warp
// are a subtree (warp_tree_sum), and the tree over such chunks' sums (chunk_tree_sum) is the
// whole tree, whatever the blocks, slots, threads, passes, clusters, protocol or world size.
#ifndef SOLLAT_RMSNORM_MATH_H_
#define SOLLAT_RMSNORM_MATH_H_

#include "sollat/collective.h"

namespace sollat {

// One rounding each, never contracted into an FMA (explicit .rn), whatever the build options.
__device__ __forceinline__ float add_rn(float a, float b) {
  float r; asm("add.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b)); return r;
}
__device__ __forceinline__ float mul_rn(float a, float b) {
  float r; asm("mul.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b)); return r;
}
__device__ __forceinline__ float div_rn(float a, float b) {
  float r; asm("div.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b)); return r;
}
__device__ __forceinline__ float sqrt_rn(float a) {
  float r; asm("sqrt.rn.f32 %0, %1;" : "=f"(r) : "f"(a)); return r;
}

// ---- the FP8 copy (SOLLAT_RMSNORM_FP8) ------------------------------------------------------
// Two floats to two e4m3 bytes, lo in the low byte: round to nearest even, saturating to +-448;
// a NaN becomes kFp8E4M3NaN whatever the instruction wrote.
__device__ __forceinline__ u32 e4m3x2(float lo, float hi) {
  u16 r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));  // a -> high byte
  u32 b = r;
  if (lo != lo) b = (b & 0xFF00u) | (u32)kFp8E4M3NaN;
  if (hi != hi) b = (b & 0x00FFu) | ((u32)kFp8E4M3NaN << 8);
  return b;
}

// The FP8 copy of one pack of the stored output: element e's byte (float(y_e) / scale, div.rn,
// then e4m3x2) in byte e of the word.
template <typename T, int kBytes>
__device__ __forceinline__ u64 e4m3_word(const Pack<T, kBytes>& y, float scale) {
  constexpr int kElems = Pack<T, kBytes>::kElems;
  static_assert(kElems % 2 == 0 && kElems <= 8, "e4m3 pairs, at most one 8-byte store");
  u64 word = 0;
#pragma unroll
  for (int e = 0; e < kElems; e += 2)
    word |= (u64)e4m3x2(div_rn(to_acc(y.v[e]), scale), div_rn(to_acc(y.v[e + 1]), scale)) << (8 * e);
  return word;
}

// kElems bytes as one store (element e in byte e, little endian).
template <int kElems> struct Fp8Word;
template <> struct Fp8Word<2> { typedef u16 type; };
template <> struct Fp8Word<4> { typedef u32 type; };
template <> struct Fp8Word<8> { typedef u64 type; };

// Bytes e0 .. e0+kElems-1 of a row of n: one store when the line is whole and aligned, else
// byte by byte up to the row's end (odd hidden sizes, views at any offset).
template <int kElems>
__device__ __forceinline__ void store_fp8(unsigned char* row, u64 e0, u64 n, u64 word) {
  typedef typename Fp8Word<kElems>::type W;
  unsigned char* p = row + e0;
  if (e0 + kElems <= n && is_aligned(p, kElems)) {
    *reinterpret_cast<W*>(p) = (W)word;
  } else {
#pragma unroll
    for (int k = 0; k < kElems; ++k)
      if (e0 + k < n) p[k] = (unsigned char)(word >> (8 * k));
  }
}

// Where the FP8 copy goes (unused without SOLLAT_RMSNORM_FP8).
struct Fp8Out {
  unsigned char* q;    // [rows, hidden] float8_e4m3fn
  const float* scale;  // one float32, read by every thread at the start of the call
};

// ---- the residual add and the sum of squares ------------------------------------------------
// r = round_T(float(s) + float(res)) of the AllReduce's rounded sum s (the unfused path's input, and
// what the fused kernels round their fp32 sum to first: residual_add).
template <typename T>
__device__ __forceinline__ T add_residual(T s, T res) {
  return from_acc<T>(add_rn(to_acc(s), to_acc(res)));
}
template <typename T>
__device__ __forceinline__ T residual_add(float sum, T res) {
  return add_residual<T>(from_acc<T>(sum), res);
}

// The pairwise tree over the squares of one pack's elements (a power of two of them; elements past
// the row's end are +0 and square to +0): the subtree of the row's tree over this pack.
template <typename T, int kBytes>
__device__ __forceinline__ float square_tree(const Pack<T, kBytes>& r) {
  constexpr int kElems = Pack<T, kBytes>::kElems;
  static_assert(kElems >= 1 && (kElems & (kElems - 1)) == 0, "a pack holds a power of two of elements");
  float s[kElems];
#pragma unroll
  for (int e = 0; e < kElems; ++e) {
    const float v = to_acc(r.v[e]);
    s[e] = mul_rn(v, v);
  }
#pragma unroll
  for (int w = 1; w < kElems; w *= 2)
#pragma unroll
    for (int e = 0; e < kElems; e += 2 * w) s[e] = add_rn(s[e], s[e + w]);
  return s[0];
}

// Sum over the 32 lanes as a pairwise tree over adjacent lanes (step o adds lanes l and l ^ o:
// a + b == b + a bitwise, so every lane gets the same bits, and the result is the tree over the
// lanes in lane order). Every lane of the warp must call it (full mask).
__device__ __forceinline__ float warp_tree_sum(float v) {
#pragma unroll
  for (int o = 1; o < kWarpSize; o <<= 1) v = add_rn(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  return v;
}

// warp_tree_sum of each of kN values with the kN butterflies interleaved: log2(32) dependent
// shuffle steps in all instead of that many per value. Each value's bits are its warp_tree_sum's.
// Every lane of the warp must call it (full mask).
template <int kN>
__device__ __forceinline__ void warp_tree_sums(float (&v)[kN]) {
#pragma unroll
  for (int o = 1; o < kWarpSize; o <<= 1)
#pragma unroll
    for (int i = 0; i < kN; ++i) v[i] = add_rn(v[i], __shfl_xor_sync(0xFFFFFFFFu, v[i], o));
}

// A chunk is kWarpSize consecutive packs of a row starting at a multiple of kWarpSize (one warp's
// packs of one slot in one pass: the kernels' thread counts are multiples of 32), so its
// warp_tree_sum of square_trees is an aligned subtree of the row's tree. A row has at most
// kRmsnormMaxChunks chunks: 8-byte packs (the smallest, LL) of fp32 at abi.h's kRmsnormMaxHidden
// (rmsnorm.MAX_HIDDEN).
constexpr int kRmsnormMaxChunks = kWarpSize * kWarpSize;
template <typename T, int kBytes> struct RmsnormChunks {  // chunk slots a row of this pack size may need
  static constexpr int value = kRmsnormMaxHidden / Pack<T, kBytes>::kElems / kWarpSize;
};
static_assert(RmsnormChunks<float, 8>::value <= kRmsnormMaxChunks, "chunk_tree_sum covers every row");

// The row's sum of squares from its n chunk sums (float bits; chunk c at bits[c], n <= 1024): the
// tree over the chunks zero-padded to 1024 = 32 x 32, i.e. a butterfly over each aligned group of 32
// chunks (zeros past n), then one over the 32 group sums (group g's held by lane g, zeros past the
// last). Every lane of the warp must call it; every lane (and every warp that calls it) gets the
// same bits.
__device__ __forceinline__ float chunk_tree_sum(const u32* bits, int n) {
  const int lane = (int)threadIdx.x & (kWarpSize - 1);
  float mine = 0.0f;
  const int groups = (n + kWarpSize - 1) / kWarpSize;  // warp-uniform
  for (int g = 0; g < groups; ++g) {
    const int c = g * kWarpSize + lane;
    const float v = warp_tree_sum(c < n ? __uint_as_float(bits[c]) : 0.0f);
    if (lane == g) mine = v;
  }
  return warp_tree_sum(mine);
}

// chunk_tree_sum's bits for n <= kQuadChunks chunks (bits 16-byte aligned) in at most 6 shuffles
// instead of 10: lane l adds chunks 4l .. 4l+3 as a tree of two levels (one 16-byte shared load;
// zeros past n), then the butterfly over the lanes up to the next power of two of ceil(n / 4), and
// lane 0's value goes to every lane. That is the pairwise tree over the chunks zero-padded to a
// power of two, i.e. the row's tree. Every lane of the warp must call it (full masks).
constexpr int kQuadChunks = 4 * kWarpSize;
__device__ __forceinline__ float quad_tree_sum(const u32* bits, int n) {
  const int lane = (int)threadIdx.x & (kWarpSize - 1);
  const int c = 4 * lane;
  float v = 0.0f;
  if (c < n) {
    const Pack<u32, 16> q = *reinterpret_cast<const Pack<u32, 16>*>(bits + c);
    const float a = __uint_as_float(q.v[0]);
    const float b = c + 1 < n ? __uint_as_float(q.v[1]) : 0.0f;
    const float d = c + 2 < n ? __uint_as_float(q.v[2]) : 0.0f;
    const float e = c + 3 < n ? __uint_as_float(q.v[3]) : 0.0f;
    v = add_rn(add_rn(a, b), add_rn(d, e));
  }
  const int used = (n + 3) / 4;  // lanes holding chunks; warp-uniform
  for (int o = 1; o < used; o <<= 1) v = add_rn(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  return __shfl_sync(0xFFFFFFFFu, v, 0);
}

// The row's sum of squares from its n chunk sums (bits 16-byte aligned, 1 <= n <= kRmsnormMaxChunks):
// quad_tree_sum where it covers the row, else chunk_tree_sum; the same bits either way.
__device__ __forceinline__ float row_tree_sum(const u32* bits, int n) {
  return n <= kQuadChunks ? quad_tree_sum(bits, n) : chunk_tree_sum(bits, n);
}

}  // namespace sollat

#endif  // SOLLAT_RMSNORM_MATH_H_
