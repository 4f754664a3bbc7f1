// sollat/protocol_sentinel.h - the sentinel protocol: 16 bytes of payload, empty = all ones.
//
//   one scratch line (16 B), written by exactly one sender thread, read and reset by one receiver
//   +---------------------------------------------------------------+
//   | 16 B of elements; every element of an empty line is all ones  |
//   +---------------------------------------------------------------+
//
// | word     | writer                         | scope | meaning                 | at rest     |
// |----------|--------------------------------|-------|-------------------------|-------------|
// | element  | sender (data), receiver (reset)| sys   | data, or "empty"        | all ones    |
//
// All ones is a NaN in fp32, fp64, bf16 and fp16 alike, so one reset pattern serves every dtype
// and the region needs no re-fill when calls change dtype. The sender canonicalises every NaN to
// a quiet NaN that is not all ones (types.h, Bits<T>::kCanonicalNaN), so valid data can never look
// empty, and NaN inputs still give NaN outputs.
//
// The receiver accepts a line only when *no element* equals the sentinel, so even a store torn at
// element granularity is never read half-written. After reading it stores the sentinel back
// (reset). That reset must land before the sender writes this line again. The sender writes it
// again only after receiving this receiver's *next* message on the same line-channel, so the
// reset needs to be ordered before the receiver's next send: inside one kernel a
// `fence.acq_rel.gpu` does that (LLBuffer issues it lazily, before the first send after a reset);
// across kernels the kernel boundary does (a kernel's stores are performed before the next
// kernel in the stream starts, and PDL's griddepcontrol.wait preserves that). The reset is a
// store to this GPU's own memory, whose L2 is the point where the peer's later remote store is
// serialised, which is why a gpu-scope fence suffices.
#ifndef SOLLAT_PROTOCOL_SENTINEL_H_
#define SOLLAT_PROTOCOL_SENTINEL_H_

#include "sollat/memory.h"

namespace sollat {

// Works on the two 64-bit halves of a line directly (no local arrays: those cost stack traffic on
// the hot path). Lane k of a 64-bit word holds element k of that half.
template <typename T>
struct SentinelWords {
  typedef typename Bits<T>::type B;
  static constexpr int kBits = 8 * (int)sizeof(B);
  static constexpr int kPerWord = 64 / kBits;
  static constexpr u64 kLaneMask = (kBits == 64) ? ~0ull : ((1ull << kBits) - 1ull);

  // Every NaN lane replaced by the canonical NaN.
  __device__ __forceinline__ static u64 canonicalise(u64 w) {
#pragma unroll
    for (int k = 0; k < kPerWord; ++k) {
      const u64 b = (w >> (k * kBits)) & kLaneMask;
      const bool nan = (b & (u64)Bits<T>::kExpMask) == (u64)Bits<T>::kExpMask && (b & (u64)Bits<T>::kManMask) != 0;
      if (nan) w = (w & ~(kLaneMask << (k * kBits))) | ((u64)Bits<T>::kCanonicalNaN << (k * kBits));
    }
    return w;
  }
  // True when no lane is the sentinel (all ones).
  __device__ __forceinline__ static bool full(u64 w) {
    bool ok = true;
#pragma unroll
    for (int k = 0; k < kPerWord; ++k) ok &= ((w >> (k * kBits)) & kLaneMask) != kLaneMask;
    return ok;
  }
};

struct ProtoSentinel {
  static constexpr int kPayloadBytes = 16;
  static constexpr bool kNeedsReset = true;
  static constexpr const char* kName = "sentinel";

  // The 16 bytes a sender stores: the elements with every NaN canonicalised (computed once per
  // line, whatever the number of peers: the canonicalisation is ~30 instructions).
  template <typename T>
  __device__ __forceinline__ static Line encode(const Pack<T, 16>& v, u32, u32) {
    const Line l = bit_cast<Line>(v);
    return Line{SentinelWords<T>::canonicalise(l.lo), SentinelWords<T>::canonicalise(l.hi)};
  }

  // Readiness of one polled line: 1 when no element is the sentinel, else 0.
  template <typename T>
  __device__ __forceinline__ static int check(const Line& l, u32, u32, u32*) {
    return SentinelWords<T>::full(l.lo) && SentinelWords<T>::full(l.hi) ? 1 : 0;
  }
  template <typename T>
  __device__ __forceinline__ static Pack<T, 16> payload(const Line& l) { return bit_cast<Pack<T, 16>>(l); }

  // The line is this thread's own scratch; see the header comment for how it is ordered.
  __device__ __forceinline__ static void reset(Line* own) { st_volatile_line(own, ~0ull, ~0ull); }
};

}  // namespace sollat

#endif  // SOLLAT_PROTOCOL_SENTINEL_H_
