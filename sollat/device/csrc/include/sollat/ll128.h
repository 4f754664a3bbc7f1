// sollat/ll128.h - the LL128 atomic line protocol (reduce-scatter half of the two-shot LL128
// atomic AllReduce, kernels/allreduce_ll128.cu). fp32, bf16 and fp16; sum only.
//
// Unit of work: one warp-unit = 4 accumulator lines of 128 B = 512 B of the owner's scratch.
// Lane l of the warp owns the 16 bytes [16 l, 16 l + 16) of the unit, so line k = lanes 8k..8k+7.
// E = 16 / sizeof(T) elements per lane (4 for fp32, 8 for bf16/fp16).
//
//   lane:   0    1 .. 7   | 8    9 .. 15  | 16   17 .. 23 | 24   25 .. 30   31
//   line:   0             | 1             | 2             | 3
//   carries C+d  d .. d   | C+d  d .. d   | C+d  d .. d   | C+d  d .. d     X
//     d   = E user elements: user elements [l E, l E + E) of the unit
//     C+d = element 0 is the line's COUNTER, elements 1..E-1 are user elements l E + 1 ..
//     X   = the displaced elements: element k (k < 4) = user element (8k) E, the one the
//           counter of line k displaced; elements 4..E-1 (16-bit types only) are zero padding
//   31 lanes x 16 B of user data per 512 B: 124 fp32 or 248 16-bit user elements per unit.
//
// | word            | writer                    | op / scope             | meaning              | at rest |
// |-----------------|---------------------------|------------------------|----------------------|---------|
// | lane l 16 B     | every rank, lane l        | red.add v4 (f32 or     | running sum of the   | 0       |
// |                 | (16 B vector atomic add)  | bf16x2/f16x2), .sys    | R contributions      |         |
// | counter (elem 0 | every rank, lane 8k: 1    | in the same vector add | number of ranks that | 0       |
// | of lane 8k)     | (split: separate add)     | (split: scalar red)    | contributed: R=done  |         |
// | lane 31         | every rank, lane 31       | red.add v4             | sums of displaced    | 0       |
// |                 |                           |                        | elements 0 of lines  |         |
// Only the owner reads and zeroes its lines; for 16-bit types the counter word polled is the
// 4-byte pair (counter, user element 1) and only its low half (element 0) is compared.
// Counter exactness: 1.0 added R <= 8 times is exact in fp32, bf16 and fp16.
//
// Ordering (why the owner may read the line when the counter reads R):
//   SOLLAT_LL128_SPLIT=0 (the paper's version, NVLink only): the counter travels in the same
//     128-byte line as the data, written by the same warp-wide vector add; NVLink applies a
//     warp's 128-byte line add atomically at the owner, so a counter of R means all R lines
//     landed. The owner's data loads are issued after (control dependent on) the poll that saw
//     R and hit the same L2 line. This is a hardware property, not a PTX-model guarantee, and
//     it cannot be assumed for adds issued on one GPU (the SM's L2 slices may apply the eight
//     16-byte reds of a line separately).
//   SOLLAT_LL128_SPLIT=1 (one GPU, virtual ranks; also model-correct): data lanes add with
//     element 0 = +0, then __syncwarp(); fence.acq_rel at the peer scope (fence<peer_scope()>:
//     .gpu on virtual ranks, the only ones split mode is built for); then lane 8k adds the counter
//     (1 in element 0; for 16-bit pairs (1, -0), which leaves element 1 bit-exact). The owner
//     issues the same fence after seeing R and before reading: release/acquire through the
//     counter's atomics, so every rank's data add happens before the owner's read.
// Reuse (zero at rest, no barrier): after reading, the owner stores zeros into the line, then
//   fence<peer_scope()>() (acq_rel), then sends its all-gather (LL) of that epoch. A line of
//   parity p is added into again at epoch e + 2, by a rank that has received this owner's
//   all-gather of epoch e + 1, which the owner sent after the zeroing and its fence; the adder
//   fences (ag.releaseReceives(), acq_rel at the peer scope) between that receive and its adds,
//   since PTX orders the poll's load before the adds by nothing else. The two fences synchronise
//   through the all-gather line, so the owner's read and zeroing of e happen before the adds of
//   e + 2. Across kernels the kernel boundary orders it. The owner's own adds into the line come
//   from the same lane that zeroed the same 16 bytes (same-address order).
#ifndef SOLLAT_LL128_H_
#define SOLLAT_LL128_H_

#include "sollat/memory.h"

#ifndef SOLLAT_LL128_SPLIT
#define SOLLAT_LL128_SPLIT 0
#endif

namespace sollat {
namespace ll128 {

// The unit's geometry is the contract's (abi.h, sollat/device/abi.py LL128_*).
constexpr int kLaneBytes = sollat::kLineBytes;          // a lane: one 16-byte scratch line
constexpr int kLineBytes = kLL128LineBytes;              // 128
constexpr int kLanesPerLine = kLineBytes / kLaneBytes;  // 8
constexpr int kLinesPerUnit = kLL128LinesPerUnit;        // 4
constexpr int kUnitBytes = kLinesPerUnit * kLineBytes;  // 512
constexpr int kDisplacedLane = kLL128DisplacedLane;      // 31
constexpr int kDataLanes = kLL128DataLanes;              // 31
constexpr int kLinesPerUnit16 = kUnitBytes / kLaneBytes;  // 16-byte scratch lines per unit (32)
static_assert(kUnitBytes == kWarpSize * kLaneBytes, "one lane per thread of a warp");

template <typename T>
struct Traits {
  static constexpr int kElems = kLaneBytes / (int)sizeof(T);  // per lane
  static constexpr int kUnitElems = kDataLanes * kElems;      // user elements per unit
};

// The 16 bytes of one lane as four 32-bit words (word 0 holds element 0 in its low bits).
struct W4 { u32 w[4]; };

// Bits of the counter increment in the element-0 position of word 0.
template <typename T> struct CounterBits;
template <> struct CounterBits<float> { static constexpr u32 kOne = 0x3F800000u, kMask = 0xFFFFFFFFu; };
template <> struct CounterBits<bf16>  { static constexpr u32 kOne = 0x3F80u, kMask = 0xFFFFu; };
template <> struct CounterBits<f16>   { static constexpr u32 kOne = 0x3C00u, kMask = 0xFFFFu; };

// Value of the counter (element 0) held in the polled word.
__device__ __forceinline__ float counter_value(float*, u32 w) { return __uint_as_float(w); }
__device__ __forceinline__ float counter_value(bf16*, u32 w) { bf16 b; b.bits = (u16)(w & 0xFFFFu); return to_acc(b); }
__device__ __forceinline__ float counter_value(f16*, u32 w) { f16 h; h.bits = (u16)(w & 0xFFFFu); return to_acc(h); }

// Split mode: the counter increment a lane 8k adds into its line's first word on its own.
// (1, -0) for 16-bit pairs: x + -0 == x for every x, so the pair's element 1 is untouched.
__device__ __forceinline__ float counter_add(float*) { return 1.0f; }
__device__ __forceinline__ u32 counter_add(bf16*) { return 0x80000000u | CounterBits<bf16>::kOne; }
__device__ __forceinline__ u32 counter_add(f16*) { return 0x80000000u | CounterBits<f16>::kOne; }

// The reduce-scatter's signature word (kernels/allreduce_ll128.cu, "Signature words"): one aligned
// 8-byte word per (owner, parity, source, warp), sig << 32 | epoch, where epoch is the 32-bit
// accumulator epoch the word travels with. One store, single-copy atomic: the reader sees the
// signature and the epoch of the same store. It needs no reset: a word in parity p only ever holds
// epochs e, e-2, ... (every iteration writes every owner's), and its signature half is 0 only at
// rest (signatures are odd; the host zeroes the words).
struct SignatureWord {
  typedef u64 Word;
  static constexpr int kEpochBits = 4 * (int)sizeof(Word);  // the low half: the epoch; the high half: the signature
  static constexpr Word kEpochMaskW = (Word)((1ull << kEpochBits) - 1u);
  __device__ __forceinline__ static Word make(u32 sig, u32 epoch) {
    return (Word)(((Word)sig << kEpochBits) | ((Word)epoch & kEpochMaskW));
  }
  __device__ __forceinline__ static u32 sig(Word w) { return (u32)(w >> kEpochBits); }
  // 1: this call's; -1: this epoch from another call (a mismatch); 0: not yet (older, or at rest).
  __device__ __forceinline__ static int check(Word w, u32 sig, u32 epoch) {
    if (w == make(sig, epoch)) return 1;
    return ((w & kEpochMaskW) == ((Word)epoch & kEpochMaskW) && (w >> kEpochBits) != 0u) ? -1 : 0;
  }
};

}  // namespace ll128
}  // namespace sollat

#endif  // SOLLAT_LL128_H_
