// sollat/layout.h - where a line lives in the scratch: the device side of sollat/layout.py.
//
// Every kernel computes slot indices, line addresses and region sizes with these helpers (the
// host sizes the same regions with layout.region_bytes and abi.py's constants).
#ifndef SOLLAT_LAYOUT_H_
#define SOLLAT_LAYOUT_H_

#include "sollat/types.h"

namespace sollat {

// layout.slot_index: line-channel `slot` (< kMaxSlotsPerThread) of (block, thread).
__device__ __forceinline__ int slot_index(int block, int slot, int thread) {
  return (block * kMaxSlotsPerThread + slot) * kMaxThreads + thread;
}

// layout.ll128_acc_slot: LL128's accumulator slot (and epoch index) of (block, thread).
__device__ __forceinline__ int ll128_acc_slot(int block, int thread) { return block * kMaxThreads + thread; }

// layout.line_index: line of (parity, source, slot) inside a receiver's region.
__device__ __forceinline__ long long line_index(int parity, int src, int slot, int nranks, int lines_per_src) {
  return (long long)(parity * nranks + src) * lines_per_src + slot;
}

// layout.region_bytes: one buffer region on one rank, 2 parities x nranks sources x lines.
__device__ __forceinline__ u64 region_bytes(int nranks, int lines_per_src) {
  return 2ull * nranks * lines_per_src * sizeof(Line);
}

}  // namespace sollat

#endif  // SOLLAT_LAYOUT_H_
