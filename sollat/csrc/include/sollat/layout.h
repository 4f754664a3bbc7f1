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

// layout.signature_line: the line whose first 8 bytes hold block `block`'s signature word
// (sentinel buffers, ll_buffer.h) in a receiver's (parity, source) part, one 32-byte sector per
// block: counted from the end of the part, past every data slot (layout.lines_per_src leaves room
// for max_blocks blocks; a grid never has more).
__device__ __forceinline__ int signature_line(int block, int lines_per_src) { return lines_per_src - 2 * (block + 1); }

// layout.ll128_acc_slot: LL128's accumulator slot (and epoch index) of (block, thread).
__device__ __forceinline__ int ll128_acc_slot(int block, int thread) { return block * kMaxThreads + thread; }

// The first line of (parity, source) inside a receiver's region; + slot index = layout.line_index.
// Two precisions, each the arithmetic its callers always used (their generated code is unchanged):
// LLBuffer's (32-bit index, 64-bit product) and LL128's accumulator line (64-bit throughout).
__device__ __forceinline__ long long line_base(int parity, int src, int nranks, int lines_per_src) {
  return (long long)(parity * nranks + src) * lines_per_src;
}
__device__ __forceinline__ u64 line_base(u64 parity, int src, int nranks, u64 lines_per_src) {
  return (parity * nranks + src) * lines_per_src;
}

// layout.region_bytes: one buffer region on one rank, kParities x nranks sources x lines.
__device__ __forceinline__ u64 region_bytes(int nranks, int lines_per_src) {
  return (u64)kParities * nranks * lines_per_src * sizeof(Line);
}

}  // namespace sollat

#endif  // SOLLAT_LAYOUT_H_
