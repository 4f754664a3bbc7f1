// sollat/bulk_buffer.h - the bulk protocol: block-wide areas published by one flag each.
//
// LL and sentinel lines carry their own completion (a flag word in every line, or a non-sentinel
// value the reader must reset), which costs half the payload or one reset store per line and one
// poll per line. For megabytes that overhead dominates. A BulkBuffer is one block's view of a
// buffer region in which the unit of completion is an *area*: a block fills its area in a peer's
// scratch with plain vector stores, then publishes it with one flag store (as NCCL's Simple
// protocol and its symmetric kernels do). The reader polls one flag per (peer, area) and then reads
// the whole area.
//
// Layout (the region and epoch array are the usual ones, sollat/device/layout.py): in every (parity,
// source) part of the region, block b's area is the kBulkAreaLines lines (abi.h) from slot_index(b, 0, 0);
// data in lines 0 .. kBulkDataLines-1, the flag (one u64) in the last line. The flag holds the call
// signature (high word: the whole of it, as LLBuffer's descriptor carries it) and a sequence number (low word): the
// sender's k-th exchange on block b's channel carries seq = k (from 1; the block's counter lives in
// the epoch array at slot_index(b, 0, 0), loaded by begin() and stored by commit()), in parity
// seq & 1. Sequence numbers only grow, so a reader waits for (low word) - seq >= 0; then a high
// word other than its own signature means the peer made this exchange in a call with other
// arguments (size, dtype, op or algorithm): a call mismatch, reported on every rank, never summed.
//
// Reuse (double buffering, as in ll_buffer.h): the kernel must only write a peer's area of seq + 2
// after learning that the peer finished reading seq in it (kernels/allreduce_bulk.cu says which
// received flag tells it). All blocks of a call exist on every rank alike (same geometry), so
// every channel's counter agrees across ranks.
//
// Memory-ordering contract (every primitive is block-wide: every thread of the block calls it):
//   store/peer area   weak 16-byte stores (the data; memory.h st_weak), no fence of their own.
//   post(seq)         bar.sync, then thread q (q < nranks, q != own rank) stores (sig, seq) into peer q's
//                     flag with one 8-byte st.release at the peer's scope: the barrier orders the whole
//                     block's area stores before that release (CTA-scope synchronisation, then the
//                     release at the peer's scope: causality order is transitive), which publishes
//                     them with the flag.
//   wait(seq)         thread q polls peer q's flag in the own area with 8-byte ld.acquire at the peer's
//                     scope (a bounded Spin, fault.h; signature and seq are one aligned 8-byte access,
//                     single-copy atomic), then bar.sync: every thread's later area loads follow the
//                     acquire in causality order. Returns false on every thread if any wait gave up or
//                     saw another call's signature (recorded as a mismatch, fault.h): the kernel stops.
//   load              weak 16-byte loads after that barrier (memory.h ld_weak_l2: `ld.global.cg`,
//                     served by L2, where the peer's stores land, never from a line this SM's L1 kept
//                     from the area's use two exchanges earlier).
// Reuse: a peer writes an area of seq + 2 only after this block posted a flag that it sent after
// its last loads of seq (post's barrier orders every thread's loads before the release), and the
// writer's acquire orders its stores after that flag: PTX's release/acquire, no control dependency.
#ifndef SOLLAT_BULK_BUFFER_H_
#define SOLLAT_BULK_BUFFER_H_

#include "sollat/fault.h"
#include "sollat/impl/ll_buffer__types.h"  // BufferDesc
#include "sollat/layout.h"

namespace sollat {

template <int kMaxRanks>
class BulkBuffer {
 public:
  static_assert(kBulkAreaLines == kMaxSlotsPerThread * kMaxThreads, "an area is one block's slot indices");
  static_assert(kBulkDataLines == kBulkAreaLines - 1, "the last line of an area is its flag");

  // `stop` points to one int in shared memory that the kernel set to 0 before its first wait.
  __device__ BulkBuffer(const BufferDesc<kMaxRanks>& desc, const FaultSink& fault, int block, int* stop)
      : d_(desc), fault_(&fault), area0_(slot_index(block, 0, 0)), block_(block), stop_(stop) {}

  // Line 0 of the area this rank writes in `peer`'s region for exchange `seq` (source = own rank).
  __device__ __forceinline__ Line* peerArea(int peer, u32 seq) const { return area(peer, d_.rank, seq); }
  // Line 0 of the own area that `src` writes for exchange `seq`.
  __device__ __forceinline__ const Line* ownArea(int src, u32 seq) const { return area(d_.rank, src, seq); }

  // The data: weak accesses, ordered by the flags' release/acquire and the barriers (see above).
  __device__ __forceinline__ static Line load(const Line* p) { return ld_weak_l2(p); }
  __device__ __forceinline__ static void store(Line* p, const Line& l) { st_weak(p, l); }

  __device__ __forceinline__ void post(u32 seq) const {
    __syncthreads();  // every thread's area stores precede the release below
    const int q = threadIdx.x;
    if (q < d_.nranks && q != d_.rank)
      st<Order::Release, peer_scope()>(flag(q, d_.rank, seq), ((u64)d_.sig << 32) | seq);
  }

  __device__ __forceinline__ bool wait(u32 seq) const {
    const int q = threadIdx.x;
    if (q < d_.nranks && q != d_.rank) {
      const u64* f = flag(d_.rank, q, seq);
      Spin spin(*fault_);
      for (;;) {
        const u64 v = ld<Order::Acquire, peer_scope()>(f);
        if ((int)((u32)v - seq) >= 0) {
          if ((u32)(v >> 32) == d_.sig) break;
          fault_->raise(kMismatch, d_.rank, q, block_, seq, (u32)(v >> 32));
          *stop_ = 1;  // benign race: every writer stores 1
          break;
        }
        if (!spin.again(d_.rank, q, block_, seq)) {
          *stop_ = 1;
          break;
        }
      }
    }
    __syncthreads();  // the acquires above precede every thread's area loads; *stop_ is seen by all
    return *stop_ == 0;
  }

  // The channel's counter: the last sequence number this block used (0 before the first exchange).
  __device__ __forceinline__ u32 begin() const { return d_.epochs[area0_]; }
  // Stores it back at the end of the kernel (not after a fault); the kernel boundary orders it
  // before the next call, which reads it after griddepcontrol.wait.
  __device__ __forceinline__ void commit(u32 last) const {
    if (threadIdx.x == 0) d_.epochs[area0_] = last;
  }

 private:
  __device__ __forceinline__ Line* area(int owner, int src, u32 seq) const {
    Line* base;
    if constexpr (BufferDesc<kMaxRanks>::kWide) base = wide_base(d_, owner);
    else base = d_.base[owner];
    return base + line_base((int)(seq & 1u), src, d_.nranks, d_.lines_per_src) + area0_;
  }
  __device__ __forceinline__ u64* flag(int owner, int src, u32 seq) const {
    return (u64*)(area(owner, src, seq) + kBulkDataLines);
  }

  BufferDesc<kMaxRanks> d_;
  const FaultSink* fault_;
  int area0_;
  int block_;
  int* stop_;
};

}  // namespace sollat

#endif  // SOLLAT_BULK_BUFFER_H_
