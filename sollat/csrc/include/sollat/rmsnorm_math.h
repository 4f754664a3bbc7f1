// sollat/rmsnorm_math.h - the arithmetic of the fused AllReduce + residual add + RMSNorm
// (kernels/allreduce_rmsnorm.cu) and of its one-GPU epilogue (kernels/add_rmsnorm.cu), stated once
// so that both compute the same bits: single-rounding float ops, the FP8 copy, the warp's tree sum.
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

// Sum over the 32 lanes as a pairwise tree over adjacent lanes; every lane gets the same bits.
__device__ __forceinline__ float warp_tree_sum(float v) {
#pragma unroll
  for (int o = 1; o < kWarpSize; o <<= 1) v = add_rn(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  return v;
}

}  // namespace sollat

#endif  // SOLLAT_RMSNORM_MATH_H_
