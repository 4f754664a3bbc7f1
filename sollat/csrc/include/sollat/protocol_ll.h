// sollat/protocol_ll.h - the LL protocol: 8 bytes of payload and an 8-byte flag in one 16-byte store.
//
//   one scratch line (16 B), written by exactly one sender thread, read by one receiver thread
//   +-------------------------------+-------------------------------------------+
//   | lo: payload (8 B of elements) | hi: flag = signature << 32 | epoch       |
//   +-------------------------------+-------------------------------------------+
//
// | word    | writer                 | scope | meaning                                   | at rest |
// |---------|------------------------|-------|-------------------------------------------|---------|
// | payload | sender, same store     | sys   | the elements                              | 0       |
// | flag    | sender, same store     | sys   | epoch (low 32 bits, masked by             | 0       |
// |         |                        |       | SOLLAT_EPOCH_BITS) and the call signature |         |
// |         |                        |       | (high 32 bits, always odd, so never 0)    |         |
//
// Why one store is enough: payload and flag travel in one 16-byte aligned `st.volatile.v2.b64`,
// which is not torn, so a receiver that sees the flag sees the payload of the same store.
// No reset is needed: a line in parity p only ever holds epochs e, e-2, e-4... of its own
// line-channel (see ll_buffer.h), and those differ from e in the masked epoch bits as long as
// SOLLAT_EPOCH_BITS >= 2. The signature makes a peer that called with other arguments visible:
// its flag has the right epoch but the wrong signature, which is reported, not summed.
#ifndef SOLLAT_PROTOCOL_LL_H_
#define SOLLAT_PROTOCOL_LL_H_

#include "sollat/memory.h"

#ifndef SOLLAT_EPOCH_BITS
#define SOLLAT_EPOCH_BITS 32
#endif

namespace sollat {

constexpr u32 kEpochMask = (SOLLAT_EPOCH_BITS >= 32) ? 0xFFFFFFFFu : ((1u << SOLLAT_EPOCH_BITS) - 1u);

struct ProtoLL {
  static constexpr int kPayloadBytes = kPayloadBytesLL;
  static constexpr bool kNeedsReset = false;

  __device__ __forceinline__ static u64 flag(u32 sig, u32 epoch) {
    return ((u64)sig << 32) | (u64)(epoch & kEpochMask);
  }

  // The 16 bytes a sender stores (computed once per line, whatever the number of peers).
  template <typename T>
  __device__ __forceinline__ static Line encode(const Pack<T, kPayloadBytes>& v, u32 sig, u32 epoch) {
    return Line{bit_cast<u64>(v), flag(sig, epoch)};
  }

  // Readiness of one polled line: 1 when it holds this epoch's data for this call, 0 when not
  // yet, -1 when it holds this epoch from a call with another signature (*seen gets it).
  template <typename T>
  __device__ __forceinline__ static int check(const Line& l, u32 sig, u32 epoch, u32* seen) {
    const u64 want = flag(sig, epoch);
    if (l.hi == want) return 1;
    if ((u32)l.hi == (u32)want && l.hi != 0) { *seen = (u32)(l.hi >> 32); return -1; }
    return 0;
  }
  template <typename T>
  __device__ __forceinline__ static Pack<T, kPayloadBytes> payload(const Line& l) { return bit_cast<Pack<T, kPayloadBytes>>(l.lo); }

  // How a line travels. Volatile (relaxed, system scope), no fence: payload and flag are one
  // untorn 16-byte access, so the flag that says "this epoch" carries its payload with it.
  __device__ __forceinline__ static void store(Line* p, const Line& l) { st<Order::Volatile, Scope::Sys>(p, l); }
  __device__ __forceinline__ static Line load(const Line* p) { return ld<Order::Volatile, Scope::Sys>(p); }

  // Nothing to clear (see above); csrc/kernels/diag_oneshot_breakdown.cu's ProtoLLReset clears.
  __device__ __forceinline__ static void reset(Line*) {}
};

}  // namespace sollat

#endif  // SOLLAT_PROTOCOL_LL_H_
