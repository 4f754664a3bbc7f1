// Bulk two-shot AllReduce for large messages (reduce-scatter + all-gather), with the BulkBuffer API.
//
// The message is cut into R chunks as in allreduce_twoshot.cu (rank c owns chunk c), and each
// chunk into rounds of gridDim.x areas: block b moves area b of every round, with plain vector
// stores and one flag per (peer, area) (bulk_buffer.h), reading the caller's input and writing
// the caller's output directly (no copy through a staging buffer). Round k of block b, exchange
// seq = (the channel's counter) + 1 + k:
//   RS send   area b of every chunk c != self -> rank c's buffer 0; post
//   RS wait   every peer's area of the own chunk; reduce in rank order 0..R-1 (every rank adds in
//             the same order: bitwise-identical outputs) -> out, and -> every peer's buffer 1; post
//   RS send   of round k + 1 (its data in flight while this round's all-gather is waited for)
//   AG wait   every owner's reduced area; copy it -> out
// Credit (when an area is free to be written again, bulk_buffer.h), per block, from this order:
//   * my RS area of seq + 2 at peer o is written after I received o's RS post of seq + 1, which o
//     sent after reducing seq (it reads my area of seq before): free.
//   * o's AG area of seq + 2 at me is written by o after it received my RS post of seq + 2, which
//     I send after copying out the AG area of seq: free.
//   Across calls the channel's sequence simply continues (the kernel boundary orders them).
// In place (out == in) is safe: a round's output positions are read (RS send, reduce) before
// they are written, by the same block, with a barrier between.
//
// Module defines as in allreduce_twoshot.cu (SOLLAT_PROTO is not used). Kernel: twoshot_bulk.
#include "sollat/bulk_buffer.h"
#include "sollat/collective.h"

using namespace sollat;

constexpr int kBuffers = kTwoshotBulkBuffers;  // abi.h (sollat/device/abi.py KERNELS)

// Tuning, as module defines so that builds can be compared in one run (scripts/ab_latency.py
// --define; docs/benchmarks.md): lines in flight per thread in every copy loop, and the most lines
// an area carries per round (smaller rounds pipeline the phases more finely, larger ones post
// fewer flags; at most the area's capacity). The all-gather is pushed, and a round's reduce-scatter
// is sent after the previous round's wait: a pulled all-gather measured no faster, and sending the
// next reduce-scatter early (safe: sollat/model/bulk.py, "bulk-r2-early-send") equal at 8-16 MiB,
// 5-7 % slower at 32-64 MiB (docs/benchmarks.md, the bulk two-shot).
#ifndef SOLLAT_BULK_UNROLL
#define SOLLAT_BULK_UNROLL 2  // 2 / 4 / 8: 218.2 / 221.5 / 232.3 us at 64 MiB fp32 (docs/benchmarks.md)
#endif
#ifndef SOLLAT_BULK_ROUND_LINES
#define SOLLAT_BULK_ROUND_LINES kBulkDataLines
#endif
constexpr int kUnroll = SOLLAT_BULK_UNROLL;
constexpr u64 kRoundLines = SOLLAT_BULK_ROUND_LINES < kBulkDataLines ? SOLLAT_BULK_ROUND_LINES : kBulkDataLines;

template <typename T, class Op, int kMaxRanks>
__device__ __forceinline__ void twoshot_bulk(const CallArgs& a, const T* in, T* out) {
  typedef BulkBuffer<kMaxRanks> Buf;
  typedef Pack<T, kLineBytes> P;
  typedef AccPack<T, kLineBytes> A;
  constexpr int kElems = P::kElems;

  __shared__ int stop;
  if (threadIdx.x == 0) stop = 0;  // ordered before any wait's store by the barrier in post()/wait()
  const int R = a.nranks, me = a.rank, b = blockIdx.x;
  const bool in_aligned = is_aligned(in, sizeof(P));
  const bool out_aligned = is_aligned(out, sizeof(P));
  const u64 chunk_lines = (ceil_div_ranks<kMaxRanks>(a.n, R) + kElems - 1) / kElems;
  const u64 chunk_elems = chunk_lines * kElems;
  const u64 G = gridDim.x;
  // As few rounds as the areas allow, and the chunk spread evenly over them (no near-empty last round).
  const u32 rounds = (u32)((chunk_lines + G * kRoundLines - 1) / (G * kRoundLines));
  const u64 L = (chunk_lines + G * rounds - 1) / (G * rounds);  // lines per area and round, <= kRoundLines
  const u64 per_round = G * L;
  const int t = threadIdx.x, bd = blockDim.x;
  // Lines [lo, lo + cnt) of every chunk are block b's in round k.
  auto first = [&](u32 k) { return (u64)k * per_round + (u64)b * L; };
  auto count = [&](u32 k) {
    const u64 lo = first(k);
    return lo >= chunk_lines ? (u64)0 : min(L, chunk_lines - lo);
  };
  auto elem = [&](int c, u64 line) { return (u64)c * chunk_elems + line * kElems; };

  // A faulted call leaves NaN in every output position of this block from round k on.
  auto poison_from = [&](u32 k) {
    for (; k < rounds; ++k)
      for (int c = 0; c < R; ++c)
        for (u64 j = t; j < count(k); j += bd)
          store_pack<T, sizeof(P)>(out, elem(c, first(k) + j), a.n, out_aligned, nan_pack<T, sizeof(P)>());
  };
  if (refused(a)) return poison_from(0);

  const FaultSink fault = make_fault(a);
  const u64 region = region_bytes(R, a.lines_per_src);
  Buf rs(make_desc<kMaxRanks>(a, 0, region), fault, b, &stop);
  Buf ag(make_desc<kMaxRanks>(a, 1, region), fault, b, &stop);
  const u32 seq0 = rs.begin() + 1;

  // RS send of round k: area b of chunk c from the input to rank c, for every c != self.
  auto send_rs = [&](u32 k) {
    const u32 seq = seq0 + k;
    const u64 lo = first(k), cnt = count(k);
    for (int c = 0; c < R; ++c) {
      if (c == me) continue;
      Line* dst = rs.peerArea(c, seq);
      for (u64 j0 = t; j0 < cnt; j0 += (u64)kUnroll * bd) {
        P v[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)  // every load issued before the stores
          if (j0 + u * bd < cnt) v[u] = load_pack<T, sizeof(P)>(in, elem(c, lo + j0 + u * bd), a.n, in_aligned);
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
          if (j0 + u * bd < cnt) Buf::store(dst + j0 + u * bd, bit_cast<Line>(v[u]));
      }
    }
    rs.post(seq);
  };

  if (rounds > 0) send_rs(0);
  for (u32 k = 0; k < rounds; ++k) {
    const u32 seq = seq0 + k;
    const u64 lo = first(k), cnt = count(k);
    if (!rs.wait(seq)) return poison_from(k);
    // Reduce the own chunk's area in rank order; write it out, and push it to every peer.
    const Line* from[kMaxRanks];  // each rank's reduce-scatter area (null: the own input)
    Line* to[kMaxRanks];          // the reduced area's place at each peer (null: none)
#pragma unroll
    for (int q = 0; q < kMaxRanks; ++q) {  // q is a constant in every copy: no indexed access
      from[q] = q < R && q != me ? rs.ownArea(q, seq) : nullptr;
      to[q] = q < R && q != me ? ag.peerArea(q, seq) : nullptr;
    }
    for (u64 j0 = t; j0 < cnt; j0 += (u64)kUnroll * bd) {
      A acc[kUnroll];
#pragma unroll
      for (int q = 0; q < kMaxRanks; ++q) {
        if (q >= R) continue;
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const u64 j = j0 + u * bd;
          if (j >= cnt) continue;
          const P v = from[q] == nullptr ? load_pack<T, sizeof(P)>(in, elem(me, lo + j), a.n, in_aligned)
                                         : bit_cast<P>(Buf::load(from[q] + j));
          if (q == 0) pack_to_acc(v, acc[u]);
          else acc_reduce<Op>(acc[u], v);
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const u64 j = j0 + u * bd;
        if (j >= cnt) continue;
        P red;
        acc_to_pack(acc[u], red);
        store_pack<T, sizeof(P)>(out, elem(me, lo + j), a.n, out_aligned, red);
#pragma unroll
        for (int q = 0; q < kMaxRanks; ++q)
          if (to[q] != nullptr) Buf::store(to[q] + j, bit_cast<Line>(red));
      }
    }
    ag.post(seq);
    if (k + 1 < rounds) send_rs(k + 1);
    if (!ag.wait(seq)) return poison_from(k);
    for (int c = 0; c < R; ++c) {
      if (c == me) continue;
      const Line* src = ag.ownArea(c, seq);
      for (u64 j0 = t; j0 < cnt; j0 += (u64)kUnroll * bd) {
        Line v[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
          if (j0 + u * bd < cnt) v[u] = Buf::load(src + j0 + u * bd);
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
          if (j0 + u * bd < cnt) store_pack<T, sizeof(P)>(out, elem(c, lo + j0 + u * bd), a.n, out_aligned, bit_cast<P>(v[u]));
      }
    }
  }
  rs.commit(seq0 - 1 + rounds);
}

__device__ __forceinline__ void twoshot_bulk_body(const CallArgs& a, const SOLLAT_T* in, SOLLAT_T* out) {
  twoshot_bulk<SOLLAT_T, SOLLAT_OP, SOLLAT_MAX_RANKS>(a, in, out);
}
SOLLAT_DEFINE_ENTRY_POINTS(twoshot_bulk, SOLLAT_T, twoshot_bulk_body)
