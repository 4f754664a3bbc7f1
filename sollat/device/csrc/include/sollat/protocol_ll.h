// sollat/protocol_ll.h - the LL protocol: two 8-byte words per 16-byte line, each 4 bytes of
// payload and its own 4-byte flag.
//
//   one scratch line (16 B), written by exactly one sender thread, read by one receiver thread
//   +-----------------------------------------+-----------------------------------------+
//   | word 0: payload bytes 0..3 | flag_0 << 32 | word 1: payload bytes 4..7 | flag_1 << 32 |
//   +-----------------------------------------+-----------------------------------------+
//   flag_h = tag_h << 16 | (epoch & kEpochMask)    tag_0 = sig & 0xFFFF, tag_1 = (sig >> 16) | 1
//
// | word   | writer             | scope | meaning                                            | at rest |
// |--------|--------------------|-------|----------------------------------------------------|---------|
// | word 0 | sender, one store  | sys   | payload bytes 0..3; flag: low 16 bits of the call  | 0       |
// |        | for both words     |       | signature (odd, so never 0) and the epoch (16 bits |         |
// |        |                    |       | at most, masked by SOLLAT_EPOCH_BITS)              |         |
// | word 1 | (same store)       | sys   | payload bytes 4..7; flag: high 16 bits of the      | 0       |
// |        |                    |       | signature with bit 0 set (never 0), the epoch      |         |
//
// Why it needs no more than PTX promises: the sender moves the line with one 16-byte
// `st.volatile.v2.b64` (one instruction, the fast path), but PTX models a vector access as its
// scalar (8-byte) parts in no particular order, so a reader may see one word new and the other
// old. Each word is an aligned 8-byte access, which PTX makes single-copy atomic, and each carries
// its own flag: its 4 payload bytes are those of the flag's call and epoch. The reader takes a
// line only when both words carry the flag it wants and keeps polling a torn or old one.
// No reset is needed: a line in parity p only ever holds epochs e, e-2, e-4... of its own
// line-channel (see ll_buffer.h), and those differ from e in the masked epoch bits as long as
// SOLLAT_EPOCH_BITS >= 2. The signature makes a peer that called with other arguments visible:
// a word with the right epoch and another tag is reported (a call mismatch), not summed. The tags
// carry 31 of the signature's 32 bits (bit 16 is always set in tag_1), so two calls whose
// signatures differ only in bit 16 look alike (one pair in 2^31).
#ifndef SOLLAT_PROTOCOL_LL_H_
#define SOLLAT_PROTOCOL_LL_H_

#include "sollat/memory.h"

#ifndef SOLLAT_EPOCH_BITS
#define SOLLAT_EPOCH_BITS 16
#endif

namespace sollat {

static_assert(SOLLAT_EPOCH_BITS >= 2 && SOLLAT_EPOCH_BITS <= 16,
              "SOLLAT_EPOCH_BITS: 2..16 (the epoch field of an LL flag is 16 bits; e and e-2 must differ)");
constexpr u32 kEpochMask = (1u << SOLLAT_EPOCH_BITS) - 1u;
constexpr u32 kEpochField = 0xFFFFu;  // the flag bits that hold the (masked) epoch

// The two flags of a line of call `sig`, epoch `epoch` (each nonzero: tag_0 is odd, tag_1 has bit 0 set).
__device__ __forceinline__ u32 ll_flag0(u32 sig, u32 epoch) { return ((sig & 0xFFFFu) << 16) | (epoch & kEpochMask); }
__device__ __forceinline__ u32 ll_flag1(u32 sig, u32 epoch) { return (((sig >> 16) | 1u) << 16) | (epoch & kEpochMask); }
__device__ __forceinline__ u64 ll_word(u32 data, u32 flag) { return (u64)data | ((u64)flag << 32); }

// Readiness of a polled line against the flags wanted: 1 when both words carry them, -1 when a
// word carries this epoch with another tag (another call), 0 otherwise (not yet written, or torn:
// keep polling). Flag 0 never is a valid flag (tags are nonzero), so a word at rest never counts
// as this epoch.
__device__ __forceinline__ bool ll_other_call(u32 f, u32 want) {
  return f != want && f != 0u && (f & kEpochField) == (want & kEpochField);
}
__device__ __forceinline__ int ll_check(const Line& l, u32 want0, u32 want1) {
  const u32 f0 = (u32)(l.lo >> 32), f1 = (u32)(l.hi >> 32);
  if (f0 == want0 && f1 == want1) return 1;
  return (ll_other_call(f0, want0) || ll_other_call(f1, want1)) ? -1 : 0;
}
// The signature of the other call as the line carries it (after ll_check said -1): tag_1 << 16 |
// tag_0, a half whose word is from another epoch (or at rest) reads 0; bit 16 is always 1.
__device__ __forceinline__ u32 ll_seen(const Line& l, u32 want0) {
  const u32 f0 = (u32)(l.lo >> 32), f1 = (u32)(l.hi >> 32), e = want0 & kEpochField;
  return (((f1 & kEpochField) == e ? f1 >> 16 : 0u) << 16) | ((f0 & kEpochField) == e ? f0 >> 16 : 0u);
}

struct ProtoLL {
  static constexpr int kPayloadBytes = kPayloadBytesLL;
  static constexpr bool kNeedsReset = false;
  static constexpr bool kSignatureLine = false;  // every LL line carries the signature already

  // The 16 bytes a sender stores (computed once per line, whatever the number of peers).
  template <typename T>
  __device__ __forceinline__ static Line encode(const Pack<T, kPayloadBytes>& v, u32 sig, u32 epoch) {
    const u64 p = bit_cast<u64>(v);
    return Line{ll_word((u32)p, ll_flag0(sig, epoch)), ll_word((u32)(p >> 32), ll_flag1(sig, epoch))};
  }

  // Readiness of one polled line: 1 when it holds this epoch's data for this call (both words),
  // 0 when not yet, -1 when a word holds this epoch from a call with another signature.
  template <typename T>
  __device__ __forceinline__ static int check(const Line& l, u32 sig, u32 epoch) {
    return ll_check(l, ll_flag0(sig, epoch), ll_flag1(sig, epoch));
  }
  // After check() said -1: the other call's signature as far as the line carries it (ll_seen).
  __device__ __forceinline__ static u32 seen(const Line& l, u32 sig, u32 epoch) { return ll_seen(l, ll_flag0(sig, epoch)); }
  template <typename T>
  __device__ __forceinline__ static Pack<T, kPayloadBytes> payload(const Line& l) {
    return bit_cast<Pack<T, kPayloadBytes>>((u64)(u32)l.lo | (l.hi << 32));
  }

  // How a line travels: one 16-byte volatile (relaxed, system scope) access, no fence. The
  // access may be performed as two 8-byte parts in any order; each part carries its own flag.
  __device__ __forceinline__ static void store(Line* p, const Line& l) { st<Order::Volatile, Scope::Sys>(p, l); }
  __device__ __forceinline__ static Line load(const Line* p) { return ld<Order::Volatile, Scope::Sys>(p); }

  // Nothing to clear (see above).
  __device__ __forceinline__ static void reset(Line*) {}
};

}  // namespace sollat

#endif  // SOLLAT_PROTOCOL_LL_H_
