// sollat/impl/ll_buffer__types.h - the storage behind LLBuffer (see ../ll_buffer.h for the contract).
#ifndef SOLLAT_IMPL_LL_BUFFER__TYPES_H_
#define SOLLAT_IMPL_LL_BUFFER__TYPES_H_

#include "sollat/abi.h"  // kMaxThreads, kMaxSlotsPerThread, kPeerWindow
#include "sollat/fault.h"

namespace sollat {

constexpr int kSlotStride = kMaxThreads;  // slot_i = slot0 + i * kSlotStride (layout.h slot_index)
constexpr int kSlotsPerBlock = kMaxSlotsPerThread * kMaxThreads;  // slot indices of one block (layout.h)

// Where one buffer lives, for one launch-rank. Up to kPeerWindow ranks every rank's region base
// is held (in registers: loops over peers are unrolled, base[k] is selected, never indexed). A wide
// group (more than kPeerWindow ranks) holds CommState's table of scratch bases and the region's
// offset instead: a peer's base is one cached load (wide_base), and its peers are walked in
// windows (ll_buffer.h). (Sixteen held bases are 32 registers: the 16-rank wide one-shot spilled
// for sm_100 with them.)
template <int kMaxRanks>
struct BufferDesc {
  static constexpr bool kWide = kMaxRanks > kPeerWindow;
  static constexpr bool kHeld = !kWide;  // every rank's base in base[]
  Line* base[kHeld ? kMaxRanks : 1];  // this buffer's region in each rank's scratch (held)
  const u64* scratch;     // wide: every rank's scratch base (CommState::scratch)
  u64 off;                // wide: this buffer's offset in every scratch
  u32* epochs;            // this rank's epoch counters for this buffer, one per slot index
  int rank;               // own rank
  int nranks;             // ranks taking part (<= kMaxRanks)
  int lines_per_src;      // slot indices per (parity, source) (layout.h lines_per_src)
  u32 sig;                // call signature (odd), carried in LL flags and signature words
};

// Rank k's region of a wide group: CommState is written once by the host before any kernel, so
// the read-only (non-coherent) path may cache it.
template <int kMaxRanks>
__device__ __forceinline__ Line* wide_base(const BufferDesc<kMaxRanks>& d, int k) {
  return (Line*)(__ldg(d.scratch + k) + d.off);
}

template <int kMaxRanks, int kSlots>
struct LLBufferBase {
  static_assert(kSlots >= 1 && kSlots <= kMaxSlotsPerThread, "kSlots out of range");
  BufferDesc<kMaxRanks> d;
  const FaultSink* fault;
  Line* own;              // d.base[d.rank], selected once (d.rank is not a compile-time index)
  int slot0;
  u32 epoch[kSlots];
  unsigned used;          // bit i: channel i carried data since the last advanceEpoch
  bool received;          // a receive completed since this buffer's last fence (the next send fences)
};

}  // namespace sollat

#endif  // SOLLAT_IMPL_LL_BUFFER__TYPES_H_
