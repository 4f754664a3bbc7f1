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

template <typename T>
__device__ __forceinline__ bool is_nan_bits(typename Bits<T>::type b) {
  return (b & Bits<T>::kExpMask) == Bits<T>::kExpMask && (b & Bits<T>::kManMask) != 0;
}

struct ProtoSentinel {
  static constexpr int kPayloadBytes = 16;
  static constexpr bool kNeedsReset = true;
  static constexpr const char* kName = "sentinel";

  template <typename T>
  __device__ __forceinline__ static void store(Line* dst, const Pack<T, 16>& v, u32, u32) {
    typedef typename Bits<T>::type B;
    constexpr int kN = 16 / (int)sizeof(B);
    B b[kN];
    memcpy(b, &v, 16);
#pragma unroll
    for (int i = 0; i < kN; ++i)
      if (is_nan_bits<T>(b[i])) b[i] = Bits<T>::kCanonicalNaN;
    Line l;
    memcpy(&l, b, 16);
    st_volatile_line(dst, l.lo, l.hi);
  }

  // Decodes one polled line: 1 when no element is the sentinel (v is filled), else 0.
  template <typename T>
  __device__ __forceinline__ static int decode(const Line& l, u32, u32, Pack<T, 16>& v, u32*) {
    typedef typename Bits<T>::type B;
    constexpr int kN = 16 / (int)sizeof(B);
    B b[kN];
    memcpy(b, &l, 16);
    bool full = true;
#pragma unroll
    for (int i = 0; i < kN; ++i) full &= (b[i] != Bits<T>::kSentinel);
    if (!full) return 0;
    memcpy(&v, &l, 16);
    return 1;
  }

  // The line is this thread's own scratch; see the header comment for how it is ordered.
  __device__ __forceinline__ static void reset(Line* own) { st_volatile_line(own, ~0ull, ~0ull); }
};

}  // namespace sollat

#endif  // SOLLAT_PROTOCOL_SENTINEL_H_
