// sollat/types.h - element types, 16-byte lines, packs and reduction operators.
//
// NVRTC compiles these headers without the CUDA toolkit's headers, so the 16-bit float types are
// plain storage structs converted with PTX `cvt` (round to nearest even, like torch).
#ifndef SOLLAT_TYPES_H_
#define SOLLAT_TYPES_H_

#include "sollat/abi.h"  // u64, u32, u16 and the sentinel / canonical NaN bits

namespace sollat {

typedef long long i64;

struct bf16 { u16 bits; };
struct f16 { u16 bits; };

// One 16-byte line: the unit every protocol moves with a single vector store (PTX: two 8-byte
// accesses in no particular order; each aligned 8-byte word is single-copy atomic).
struct alignas(16) Line { u64 lo, hi; };
static_assert(sizeof(Line) == kLineBytes, "a line is one 16-byte store");

// ---- conversions to/from the accumulation type -------------------------------------------
// 16-bit inputs accumulate in fp32 (the result is rounded once, at the end); fp32 in fp32;
// fp64 in fp64. Every rank adds in rank order 0..R-1, so every rank's output is bitwise equal.
template <typename T> struct AccOf { typedef float type; };
template <> struct AccOf<double> { typedef double type; };

__device__ __forceinline__ float to_acc(float v) { return v; }
__device__ __forceinline__ double to_acc(double v) { return v; }
__device__ __forceinline__ float to_acc(bf16 v) {
  float f; asm("cvt.f32.bf16 %0, %1;" : "=f"(f) : "h"(v.bits)); return f;
}
__device__ __forceinline__ float to_acc(f16 v) {
  float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.bits)); return f;
}
template <typename T> __device__ __forceinline__ T from_acc(typename AccOf<T>::type v);
template <> __device__ __forceinline__ float from_acc<float>(float v) { return v; }
template <> __device__ __forceinline__ double from_acc<double>(double v) { return v; }
template <> __device__ __forceinline__ bf16 from_acc<bf16>(float v) {
  bf16 r; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r.bits) : "f"(v)); return r;
}
template <> __device__ __forceinline__ f16 from_acc<f16>(float v) {
  f16 r; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r.bits) : "f"(v)); return r;
}

// ---- raw bits of an element (for NaN canonicalisation and sentinel checks) ----------------
template <typename T> struct Bits;
template <> struct Bits<float> {
  typedef u32 type;
  static constexpr u32 kSentinel = kSentinelF32;          // all ones: a NaN
  static constexpr u32 kCanonicalNaN = kCanonicalNaNF32;  // quiet NaN, never the sentinel
  static constexpr u32 kExpMask = 0x7F800000u, kManMask = 0x007FFFFFu;
};
template <> struct Bits<double> {
  typedef u64 type;
  static constexpr u64 kSentinel = kSentinelF64;
  static constexpr u64 kCanonicalNaN = kCanonicalNaNF64;
  static constexpr u64 kExpMask = 0x7FF0000000000000ull, kManMask = 0x000FFFFFFFFFFFFFull;
};
template <> struct Bits<bf16> {
  typedef u16 type;
  static constexpr u16 kSentinel = kSentinelBf16;
  static constexpr u16 kCanonicalNaN = kCanonicalNaNBf16;
  static constexpr u16 kExpMask = 0x7F80, kManMask = 0x007F;
};
template <> struct Bits<f16> {
  typedef u16 type;
  static constexpr u16 kSentinel = kSentinelF16;
  static constexpr u16 kCanonicalNaN = kCanonicalNaNF16;
  static constexpr u16 kExpMask = 0x7C00, kManMask = 0x03FF;
};

// ---- a pack: the elements one line carries ------------------------------------------------
// Bytes is the protocol's payload per line (8 for LL, 16 for sentinel).
template <typename T, int Bytes>
struct alignas(Bytes) Pack {
  static constexpr int kElems = Bytes / (int)sizeof(T);
  T v[kElems];
};

template <typename T, int Bytes>
struct AccPack {
  typedef typename AccOf<T>::type A;
  static constexpr int kElems = Bytes / (int)sizeof(T);
  A v[kElems];
};

// ---- reduction operators (on the accumulation type) ---------------------------------------
// Max/Min propagate NaN like torch.maximum/minimum.
struct OpSum {
  template <typename A> __device__ __forceinline__ static A apply(A a, A b) { return a + b; }
};
struct OpMax {
  template <typename A> __device__ __forceinline__ static A apply(A a, A b) {
    return (a != a || b != b) ? (a != a ? a : b) : (a > b ? a : b);
  }
};
struct OpMin {
  template <typename A> __device__ __forceinline__ static A apply(A a, A b) {
    return (a != a || b != b) ? (a != a ? a : b) : (a < b ? a : b);
  }
};

template <typename T, int Bytes>
__device__ __forceinline__ void pack_to_acc(const Pack<T, Bytes>& p, AccPack<T, Bytes>& a) {
#pragma unroll
  for (int i = 0; i < Pack<T, Bytes>::kElems; ++i) a.v[i] = to_acc(p.v[i]);
}
template <typename Op, typename T, int Bytes>
__device__ __forceinline__ void acc_reduce(AccPack<T, Bytes>& a, const Pack<T, Bytes>& p) {
#pragma unroll
  for (int i = 0; i < Pack<T, Bytes>::kElems; ++i) a.v[i] = Op::apply(a.v[i], to_acc(p.v[i]));
}
template <typename T, int Bytes>
__device__ __forceinline__ void acc_to_pack(const AccPack<T, Bytes>& a, Pack<T, Bytes>& p) {
#pragma unroll
  for (int i = 0; i < Pack<T, Bytes>::kElems; ++i) p.v[i] = from_acc<T>(a.v[i]);
}

// Bit-casts between a pack and raw words.
template <typename To, typename From>
__device__ __forceinline__ To bit_cast(const From& f) {
  static_assert(sizeof(To) == sizeof(From), "bit_cast size mismatch");
  To t;
  memcpy(&t, &f, sizeof(To));
  return t;
}

}  // namespace sollat

#endif  // SOLLAT_TYPES_H_
