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
// element granularity (PTX: a 16-byte vector access is two 8-byte ones in any order) is never read
// half-written. After reading it stores the sentinel back (reset). That reset must land before the
// sender writes this line again. The sender writes it again only after receiving this receiver's
// *next* message on the same line-channel, so the reset needs to be ordered before the receiver's
// next send: inside one kernel an acq_rel fence does that (LLBuffer issues fence<peer_scope()>()
// before the first send after a receive, which also orders the receive's loads: ll_buffer.h);
// across kernels the kernel boundary does (a kernel's stores are performed before the next
// kernel in the stream starts, and PDL's griddepcontrol.wait preserves that). The fence's scope is
// the peer's (memory.h, peer_scope): gpu on virtual ranks, system on real ranks, as PTX's model
// asks when the observer runs on another GPU.
//
// Sentinel lines carry no call signature, so a sentinel LLBuffer adds a signature word per
// (sending thread, receiving rank) and pass (kSignatureLine, SentinelSignature below; ll_buffer.h,
// "Signature words"): a peer that made another call is a call mismatch here too, never a sum. The
// receiver resets the word as it resets a line, under the same ordering argument.
#ifndef SOLLAT_PROTOCOL_SENTINEL_H_
#define SOLLAT_PROTOCOL_SENTINEL_H_

#include "sollat/memory.h"

namespace sollat {

// Works on the line's words directly, several elements per word at once (no local arrays, no
// per-element loop-carried chain: both sit on the path to the first send and in every poll).
// 16- and 32-bit types use the four 32-bit words of a line, 64-bit types its two 64-bit words.
template <typename T, int kBits = 8 * (int)sizeof(typename Bits<T>::type)>
struct SentinelWords;

// Two 16-bit elements per 32-bit word, handled as SIMD-within-a-register.
template <typename T>
struct SentinelWords<T, 16> {
  static_assert(Bits<T>::kSentinel == (u16)~0u, "anyEmpty below finds all-ones lanes");
  static constexpr u32 kLow = 0x00010001u, kHigh = 0x80008000u;
  static constexpr u32 kExp = Bits<T>::kExpMask;
  // A lane is a NaN iff its magnitude (sign cleared) exceeds the all-ones exponent with a zero
  // mantissa. Adding 0x7FFF - kExp to a magnitude (<= 0x7FFF) never carries out of its lane and
  // sets the lane's top bit exactly when magnitude > kExp; that bit times 0xFFFF is the lane mask.
  __device__ __forceinline__ static u32 canonicalise(u32 w) {
    const u32 nan_top = ((w & 0x7FFF7FFFu) + (0x7FFFu - kExp) * kLow) & kHigh;
    const u32 m = (nan_top >> 15) * 0xFFFFu;
    return (w & ~m) | ((u32)Bits<T>::kCanonicalNaN * kLow & m);
  }
  // Nonzero iff some lane is all ones: the classic "has a zero lane" test on ~w. A borrow into a
  // lane only comes from a lower lane that is zero, which already makes the answer nonzero.
  __device__ __forceinline__ static u32 anyEmpty(u32 w) { return (~w - kLow) & w & kHigh; }
};

template <typename T>
struct SentinelWords<T, 32> {
  __device__ __forceinline__ static u32 canonicalise(u32 w) {
    return (w & 0x7FFFFFFFu) > Bits<T>::kExpMask ? Bits<T>::kCanonicalNaN : w;
  }
  __device__ __forceinline__ static u32 anyEmpty(u32 w) { return w == Bits<T>::kSentinel ? 1u : 0u; }
};

template <typename T>
struct SentinelWords<T, 64> {
  __device__ __forceinline__ static u64 canonicalise(u64 w) {
    return (w & 0x7FFFFFFFFFFFFFFFull) > Bits<T>::kExpMask ? Bits<T>::kCanonicalNaN : w;
  }
  __device__ __forceinline__ static u32 anyEmpty(u64 w) { return w == Bits<T>::kSentinel ? 1u : 0u; }
};

// A line as the words SentinelWords<T> works on.
template <typename T, bool kWide = sizeof(T) == 8>
struct SentinelLine {
  typedef SentinelWords<T> W;
  __device__ __forceinline__ static Line canonicalise(const Line& l) {
    const u32 a = W::canonicalise((u32)l.lo), b = W::canonicalise((u32)(l.lo >> 32));
    const u32 c = W::canonicalise((u32)l.hi), d = W::canonicalise((u32)(l.hi >> 32));
    return Line{((u64)b << 32) | a, ((u64)d << 32) | c};
  }
  __device__ __forceinline__ static bool full(const Line& l) {
    return (W::anyEmpty((u32)l.lo) | W::anyEmpty((u32)(l.lo >> 32)) | W::anyEmpty((u32)l.hi) |
            W::anyEmpty((u32)(l.hi >> 32))) == 0u;
  }
};
template <typename T>
struct SentinelLine<T, true> {
  typedef SentinelWords<T> W;
  __device__ __forceinline__ static Line canonicalise(const Line& l) {
    return Line{W::canonicalise(l.lo), W::canonicalise(l.hi)};
  }
  __device__ __forceinline__ static bool full(const Line& l) { return (W::anyEmpty(l.lo) | W::anyEmpty(l.hi)) == 0u; }
};

struct ProtoSentinel {
  static constexpr int kPayloadBytes = kPayloadBytesSentinel;
  static constexpr bool kNeedsReset = true;
  static constexpr bool kSignatureLine = true;  // LLBuffer adds a signature word per thread, peer and pass

  // The 16 bytes a sender stores: the elements with every NaN canonicalised (computed once per
  // line, whatever the number of peers).
  template <typename T>
  __device__ __forceinline__ static Line encode(const Pack<T, kPayloadBytes>& v, u32, u32) {
    return SentinelLine<T>::canonicalise(bit_cast<Line>(v));
  }

  // Readiness of one polled line: 1 when no element is the sentinel, else 0 (never -1: the
  // signature words are what detects another call here).
  template <typename T>
  __device__ __forceinline__ static int check(const Line& l, u32, u32) {
    return SentinelLine<T>::full(l) ? 1 : 0;
  }
  __device__ __forceinline__ static u32 seen(const Line&, u32, u32) { return 0; }
  template <typename T>
  __device__ __forceinline__ static Pack<T, kPayloadBytes> payload(const Line& l) { return bit_cast<Pack<T, kPayloadBytes>>(l); }

  // How a line travels. Volatile (relaxed, system scope), no fence: a line counts only when every
  // element is data, so even a store torn at element granularity is never taken half-written.
  __device__ __forceinline__ static void store(Line* p, const Line& l) { st<Order::Volatile, Scope::Sys>(p, l); }
  __device__ __forceinline__ static Line load(const Line* p) { return ld<Order::Volatile, Scope::Sys>(p); }

  static_assert((u32)~0ull == kSentinelF32 && (u16)~0ull == kSentinelBf16 && (u16)~0ull == kSentinelF16 &&
                ~0ull == kSentinelF64, "an all-ones line is empty in every dtype (abi.py REST_BYTE)");
  // Volatile, no fence here: it follows this thread's load of the same address (same-address
  // order), and LLBuffer fences it before the next send (fence<peer_scope()>, header comment).
  __device__ __forceinline__ static void reset(Line* own) { st<Order::Volatile, Scope::Sys>(own, Line{~0ull, ~0ull}); }
};

// A sentinel buffer's signature word (ll_buffer.h, "Signature words"): one aligned 4-byte word per
// (receiver, parity, source, block, thread).
//
// | word      | writer                                   | scope | meaning                  | at rest |
// |-----------|------------------------------------------|-------|--------------------------|---------|
// | signature | sender (sig, with its line 0), receiver  | sys   | the sender's call, or    | 0       |
// |           | (0, once it has read sig)                |       | "empty"                  |         |
//
// Signatures are odd, so never 0 (the host zeroes the words: comm/state.py init_scratch, also at
// reset()). The receiver polls the word with the data: its own signature, accepted (and stored back
// to 0); 0, not yet; any other value, another call (a mismatch). The word carries no epoch: like a
// sentinel line it is empty from the receiver's reset until the sender's next store, and that
// store needs the credit of the channel-0 line it travels with (ll_buffer.h). A 4-byte access is
// single-copy atomic, so the reader sees the whole signature of one store.
struct SentinelSignature {
  typedef u32 Word;
  static constexpr Word kEmpty = 0u;
  // 1: this call's; -1: another call's (a mismatch); 0: not yet (empty).
  __device__ __forceinline__ static int check(Word w, u32 sig) { return w == sig ? 1 : (w != kEmpty ? -1 : 0); }
};

}  // namespace sollat

#endif  // SOLLAT_PROTOCOL_SENTINEL_H_
