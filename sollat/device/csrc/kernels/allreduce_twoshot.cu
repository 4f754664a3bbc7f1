// Two-shot AllReduce (reduce-scatter + all-gather), push mode, barrier-free, with the LLBuffer API.
//
// The message is cut into R line-aligned chunks; rank c owns chunk c. Thread (block, slot, thread)
// handles chunk-line j of every chunk:
//   reduce-scatter (buffer 0): send line j of chunk c to rank c, for every c != self; receive line
//                  j of the own chunk from every peer and reduce in rank order 0..R-1.
//   all-gather     (buffer 1): bcast the reduced line to every peer and write it; receive line j of
//                  chunk c from its owner c and write it.
// Every rank computes the same rank-order sums, so outputs are bitwise identical across ranks.
// The two phases use separate buffers with their own epochs, so each is its own credit loop
// (ll_buffer.h): a line of either buffer is written again only after the writer received the
// next epoch of that buffer's channel from the reader. The fence each loop needs between a
// receive and the next send of its buffer is issued once per pass for both, at the top of every
// pass after the first (releaseReceivesWith): it sits after the previous pass's receives of both
// buffers and before this pass's sends of both. A thread reads all R input lines before it writes
// any output, and writes exactly those positions, so in-place calls are safe.
//
// Module defines as in allreduce_oneshot.cu. Kernel: twoshot.
#include "sollat/collective.h"

using namespace sollat;

constexpr int kBuffers = kTwoshotBuffers;  // abi.h (sollat/device/abi.py KERNELS)

template <typename T, class Op, class Proto, int kMaxRanks, int kSlots>
__device__ __forceinline__ void twoshot(const CallArgs& a, const T* in, T* out) {
  typedef LLBuffer<Proto, kMaxRanks, kSlots> Buf;
  typedef typename Buf::template PackT<T> P;
  typedef typename Buf::template AccT<T> A;
  constexpr int kElems = P::kElems;

  const int R = a.nranks;
  const bool in_aligned = is_aligned(in, sizeof(P));
  const bool out_aligned = is_aligned(out, sizeof(P));
  // Chunk length in lines (sollat/collectives/algorithms.py: lines_per_rank for two-shot).
  const u64 chunk_lines = (ceil_div_ranks<kMaxRanks>(a.n, R) + kElems - 1) / kElems;
  const u64 chunk_elems = chunk_lines * kElems;
  const u64 per_iter = (u64)gridDim.x * blockDim.x * kSlots;

  // Line i of this thread in iteration `base`; its R input packs (line j of every chunk) are
  // loaded in batches of up to 4 chunks, each batch issued before any of it is used, so a batch
  // costs one memory latency (a send is volatile asm, which no later load can be hoisted over:
  // loading inside the send loop would cost one latency per chunk). A batch of 8 would not fit in
  // registers next to both buffers' descriptors at 8 ranks (ptxas spilled), nor would 4 fp64
  // batches, whose accumulators are twice as wide.
  constexpr int kBatch = kMaxRanks < 4 ? kMaxRanks : (kMaxRanks >= 8 && sizeof(T) == 8) ? 2 : 4;
  auto lines_of = [&](u64 base, u64 (&line)[kSlots]) {
    int active = 0;
#pragma unroll
    for (int i = 0; i < kSlots; ++i) {
      line[i] = base + ((u64)blockIdx.x * kSlots + i) * blockDim.x + threadIdx.x;
      if (line[i] < chunk_lines) active = i + 1;
    }
    return active;
  };
  auto load_batch = [&](int c0, int active, const u64 (&line)[kSlots], P (&v)[kBatch][kSlots]) {
#pragma unroll
    for (int k = 0; k < kBatch; ++k)
#pragma unroll
      for (int i = 0; i < kSlots; ++i)
        if (c0 + k < R && i < active)
          v[k][i] = load_pack<T, sizeof(P)>(in, (c0 + k) * chunk_elems + line[i] * kElems, a.n, in_aligned);
  };

  // A faulted call leaves NaN in every output position this thread owns from iteration `base`
  // on (line j of every chunk), never a stale or partial value.
  auto poison_from = [&](u64 base) {
    for (u64 b = base; b < chunk_lines; b += per_iter) {
      u64 ln[kSlots];
      const int act = lines_of(b, ln);
      for (int c = 0; c < R; ++c)
#pragma unroll
        for (int i = 0; i < kSlots; ++i)
          if (i < act) store_pack<T, sizeof(P)>(out, c * chunk_elems + ln[i] * kElems, a.n, out_aligned, nan_pack<T, sizeof(P)>());
    }
  };

  u64 line[kSlots];
  int active = lines_of(0, line);
  if (active == 0) return;  // no line for this thread: its channels keep their epochs
  P v[kBatch][kSlots];
  load_batch(0, active, line, v);  // before the descriptors: their loads then overlap these
  if (refused(a)) return poison_from(0);
  const FaultSink fault = make_fault(a);
  const u64 region = region_bytes(R, a.lines_per_src);
  const int slot0 = slot_index(blockIdx.x, 0, threadIdx.x);
  Buf rs(make_desc<kMaxRanks>(a, 0, region), fault, slot0);
  Buf ag(make_desc<kMaxRanks>(a, 1, region), fault, slot0);

  for (u64 base = 0;;) {
    // The previous pass's receives (both buffers) before this pass's sends: one fence, none in
    // the first pass (ll_buffer.h).
    rs.releaseReceivesWith(ag);
    // Reduce-scatter: push line j of chunk c to its owner c; keep the own chunk's line. Batch 0
    // is already loaded (before the descriptors, or by the previous iteration's prefetch).
    P mine[kSlots];
#pragma unroll  // fully up to kPeerWindow ranks; a wide group loops (the trip count is R)
    for (int c0 = 0; c0 < (Buf::kWide ? R : kMaxRanks); c0 += kBatch) {
      if (c0 >= R) continue;
      if (c0 > 0) load_batch(c0, active, line, v);
#pragma unroll
      for (int k = 0; k < kBatch; ++k) {
        const int c = c0 + k;
        if (c >= R) continue;
#pragma unroll
        for (int i = 0; i < kSlots; ++i) {
          if (i >= active) continue;
          if (c == a.rank) mine[i] = v[k][i];
          else rs.template send<T>(c, i, v[k][i]);
        }
      }
    }
    // Next iteration's batch 0, in flight while this one waits for its peers. Safe in place:
    // those are other lines than the ones this iteration writes.
    const u64 next = base + per_iter;
    u64 next_line[kSlots];
    const int next_active = next < chunk_lines ? lines_of(next, next_line) : 0;
    if (next_active > 0) load_batch(0, next_active, next_line, v);
    A acc[kSlots];
    if (!rs.template recvReduce<T, Op>(active, mine, acc)) return poison_from(base);

    // All-gather: push the reduced line of the own chunk to every peer, write it, collect the others.
    P red[kSlots];
#pragma unroll
    for (int i = 0; i < kSlots; ++i) {
      if (i >= active) continue;
      acc_to_pack(acc[i], red[i]);
      red[i] = ag.template bcast<T>(i, red[i]);  // as the peers receive it: identical bits everywhere
      store_pack<T, sizeof(P)>(out, a.rank * chunk_elems + line[i] * kElems, a.n, out_aligned, red[i]);
    }
    const bool ok = ag.template recvEach<T>(active, [&](int c, int i, const P& v) {
      store_pack<T, sizeof(P)>(out, c * chunk_elems + line[i] * kElems, a.n, out_aligned, v);
    });
    if (!ok) return poison_from(base);
    rs.advanceEpoch();
    ag.advanceEpoch();
    if (next_active == 0) break;  // later iterations only have higher lines: nothing more for this thread
    base = next;
    active = next_active;
#pragma unroll
    for (int i = 0; i < kSlots; ++i) line[i] = next_line[i];
  }
  rs.commit();
  ag.commit();
}

__device__ __forceinline__ void twoshot_body(const CallArgs& a, const SOLLAT_T* in, SOLLAT_T* out) {
  twoshot<SOLLAT_T, SOLLAT_OP, SOLLAT_PROTO, SOLLAT_MAX_RANKS, SOLLAT_SLOTS>(a, in, out);
}
SOLLAT_DEFINE_ENTRY_POINTS(twoshot, SOLLAT_T, twoshot_body)
