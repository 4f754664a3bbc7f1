// One-shot AllReduce for wide groups (more ranks than the peer window, abi.py PEER_WINDOW), LL
// protocol, written with the LLBuffer device API. The plain one-shot gives each line one thread,
// which stores it to every peer in turn and polls every peer window after window; here a line's
// peers are spread over the block: thread (g, j) handles line j for the peers of group g (ranks
// 8g .. 8g+7). It stores line j to each of them and polls their line j: one window per thread,
// all groups at once. The lines land in shared memory, and thread (0, j) reduces line j in rank
// order 0..R-1 from there. Every rank gets the bits of the rank-order reference, as with every
// deterministic sollat AllReduce.
//
// Geometry (layout.plan_peer_groups; the formulas are layout.h's, declared in abi_layout.py):
// groups = peer_groups(R) threads per line, lb = peer_group_lines(R) lines per block (whole warps,
// so a warp serves one group), blockDim.x = lb * groups. lb depends on R alone, never on the
// message size: a slot index must play the same (group, line) role in every call, or the epochs of
// a line's writer and reader drift apart and a receive waits for a line no peer sends
// (tests/cpu/test_wide_oneshot.py and the protocol model's wide-fitted-lines bug show it).
//
// Channels (ll_buffer.h): thread (g, j) owns slot s(g, j) = peer_group_slot(block, g, j, R) and its
// epoch counter. Rank r's line j for peer q is written by r's thread (group(q), j) and read by q's
// thread (group(r), j). That reader polls its own slot, so the writer stores into slot
// s(group(r), j) (sendToSlot). These two threads form one credit loop of ll_buffer.h: each sends
// the other line j and receives line j from it, once per pass, and a receive and the next send are
// separated by the buffer's fence. So a line is written at epoch e + 2 only after its writer
// received e + 1 from its reader, which sent it after reading e. Every thread whose line exists
// in a pass advances its epoch once in that pass (recvWindow marks channel 0 used even where the
// group holds no peer: the own rank's group {R-1} when R = 8k + 1), so the counter of s(g, j) on
// every rank counts the passes in which line j of the block existed: writer and reader agree.
// A thread whose line never exists keeps its epoch, as in every sollat kernel. The protocol model
// runs these programs (sollat/model/wide.py) and catches the planted bugs of the pairing
// (wide-own-slot), of the fixed lines per block (wide-fitted-lines) and of the reuse fence.
//
// Block synchronisation: warps with no line in the first pass have none in any later pass (lines
// only grow), so they leave at once and the others synchronise with a named barrier counting only
// them (barrier 1 with a thread count): the idle warps of a small message neither load epochs nor
// wait. One barrier per pass (with an OR of the threads' faults) puts the pass's lines in shared
// memory before the sums; a second one, only where another pass follows, keeps them until read.
//
// Module defines as in allreduce_oneshot.cu (SOLLAT_PROTO is ProtoLL, SOLLAT_SLOTS 1,
// SOLLAT_MAX_RANKS the rank cap: 16 (kWideUnrolledRanks), whose rank-order sum is unrolled, or the
// widest one; the host takes the 16 cap where the group fits; either reads the peers' bases from
// CommState).
// Kernel: oneshot_wide (collective.h).
#include "sollat/collective.h"

using namespace sollat;

constexpr int kBuffers = kOneshotWideBuffers;  // abi.h (sollat/device/abi.py KERNELS)

// Barrier 1 for the `threads` (a multiple of 32) threads of the block's working warps. bar.sync and
// bar.red order the shared-memory accesses of the participating threads (as __syncthreads and
// __syncthreads_or do); the "memory" clobber keeps the compiler from moving shared loads and
// stores across them. sync_working_any also returns whether `pred` held in any of those threads
// (bar.red.or: a fault seen by one thread stops the whole block, with no shared flag to clear).
__device__ __forceinline__ void sync_working(int threads) { asm volatile("bar.sync 1, %0;" ::"r"(threads) : "memory"); }
__device__ __forceinline__ bool sync_working_any(int threads, bool pred) {
  int any;
  asm volatile(
      "{\n\t.reg .pred p, q;\n\tsetp.ne.s32 p, %1, 0;\n\tbar.red.or.pred q, 1, %2, p;\n\tselp.s32 %0, 1, 0, q;\n\t}"
      : "=r"(any)
      : "r"((int)pred), "r"(threads)
      : "memory");
  return any != 0;
}

// Line j of every rank, got[q * lb + j] for q = 0..R-1, reduced in rank order. The chain of R - 1
// dependent adds is the reduction's floor; the shared-memory loads stay off it: the next kBatch
// lines are loaded while the current batch is added. Each add is guarded, never a padding add
// (x + 0 would turn -0.0 into +0.0), and every add is in rank order: the bits do not depend on
// kBatch. The widest cap takes batches of SOLLAT_REDUCE_BATCH_WIDE; the 16-rank cap
// (kWideUnrolledRanks) batches of SOLLAT_REDUCE_BATCH_UNROLLED with its loop unrolled (its trip
// count is known). The defaults are batches with which ptxas (128 registers at 512 threads) spills
// nothing for sm_90 and sm_100 in any dtype at either cap (tests/cpu/test_spills.py; 8 at the
// widest cap spilled 4-16 bytes in bf16, 4 at the 16 cap 16 bytes). A define of either
// (scripts/ab_trees.py's NAME=DIR:DEFINE=VALUE) builds another batch for an A/B.
#ifndef SOLLAT_REDUCE_BATCH_WIDE
#define SOLLAT_REDUCE_BATCH_WIDE 6
#endif
#ifndef SOLLAT_REDUCE_BATCH_UNROLLED
#define SOLLAT_REDUCE_BATCH_UNROLLED 2
#endif
template <typename T, class Op, class P, class A, int kMaxRanks>
__device__ __forceinline__ A reduce_rank_order(const P* got, int R, int lb, int j) {
  constexpr bool kUnrolled = kMaxRanks <= kWideUnrolledRanks;
  constexpr int kBatch = kUnrolled ? SOLLAT_REDUCE_BATCH_UNROLLED : SOLLAT_REDUCE_BATCH_WIDE;
  A acc;
  pack_to_acc(got[j], acc);
  P next[kBatch];
#pragma unroll
  for (int k = 0; k < kBatch; ++k)
    if (1 + k < R) next[k] = got[(1 + k) * lb + j];
#pragma unroll(kUnrolled ? (kMaxRanks + kBatch - 2) / kBatch : 1)
  for (int q0 = 1; q0 < (kUnrolled ? kMaxRanks : R); q0 += kBatch) {
    P cur[kBatch];
#pragma unroll
    for (int k = 0; k < kBatch; ++k) cur[k] = next[k];
#pragma unroll
    for (int k = 0; k < kBatch; ++k)
      if (q0 + kBatch + k < R) next[k] = got[(q0 + kBatch + k) * lb + j];
#pragma unroll
    for (int k = 0; k < kBatch; ++k)
      if (q0 + k < R) acc_reduce<Op>(acc, cur[k]);
  }
  return acc;
}

template <typename T, class Op, int kMaxRanks>
__device__ __forceinline__ void oneshot_wide(const CallArgs& a, const T* in, T* out) {
  typedef LLBuffer<ProtoLL, kMaxRanks, 1> Buf;
  static_assert(Buf::kWide, "oneshot_wide is built for the wide rank cap only");
  typedef typename Buf::template PackT<T> P;
  typedef typename Buf::template AccT<T> A;
  static_assert(sizeof(P) * kPeerGroupPacks <= 32768, "the (line, rank) packs of a pass: 32 KiB of shared memory");
  constexpr int kElems = P::kElems;
  __shared__ P got[kPeerGroupPacks];  // [q * lb + j]: line j of rank q (consecutive j: no bank conflict)

  const int R = a.nranks;
  const int lb = peer_group_lines(R);  // lines per block and pass (layout.h): the host's blockDim.x / groups
  const int g = (int)threadIdx.x / lb, j = (int)threadIdx.x % lb;
  const int q0 = g * kPeerWindow, q1 = min(q0 + kPeerWindow, R);
  const bool in_aligned = is_aligned(in, sizeof(P)), out_aligned = is_aligned(out, sizeof(P));
  const u64 lines = (a.n + kElems - 1) / kElems;
  const u64 per_iter = (u64)gridDim.x * lb;
  const u64 first = (u64)blockIdx.x * lb;  // the block's first line in pass 0 (< lines: the host launches no empty block)
  auto line_of = [&](u64 base) { return base + first + j; };
  // Working warps: in every group those whose first line exists in pass 0 (the same count in every group).
  const u64 left = lines > first ? lines - first : 0;
  const int warps = left >= (u64)lb ? lb / kWarpSize : (int)((left + kWarpSize - 1) / kWarpSize);
  const int working = warps * kWarpSize * peer_groups(R);
  if (j / kWarpSize >= warps) return;  // no line in any pass: channel untouched (its epoch is kept)

  // A faulted call leaves NaN in every output line this block has not written yet (from pass
  // `base` on); the reducing threads (g == 0) own the output.
  auto poison_from = [&](u64 base) {
    if (g != 0) return;
    for (u64 b = base; b < lines; b += per_iter)
      if (line_of(b) < lines) store_pack<T, sizeof(P)>(out, line_of(b) * kElems, a.n, out_aligned, nan_pack<T, sizeof(P)>());
  };

  // The first input load is issued before the buffer is set up (as allreduce_oneshot.cu: the
  // epoch load then travels with it).
  P v;
  if (line_of(0) < lines) v = load_pack<T, sizeof(P)>(in, line_of(0) * kElems, a.n, in_aligned);
  if (refused(a)) return poison_from(0);  // the same answer in every thread: a.prior is the rank's
  const FaultSink fault = make_fault(a);
  Buf buf(make_desc<kMaxRanks>(a, 0, region_bytes(R, a.lines_per_src)), fault, peer_group_slot(blockIdx.x, g, j, R));
  // The reader of this thread's line at every peer: thread (group of this rank, j).
  const int reader_slot = peer_group_slot(blockIdx.x, a.rank / kPeerWindow, j, R);

  for (u64 base = 0; base < lines; base += per_iter) {  // the same passes in every working thread of the block
    const bool active = line_of(base) < lines;
    bool ok = true;
    P ahead;  // the next pass's input, in flight while this pass polls (polls are volatile asm)
    const bool ahead_active = line_of(base + per_iter) < lines;
    const bool ahead_any = base + per_iter < lines;  // a next pass exists (for some block)
    if (active) {
      // sendToSlot fences after this thread's previous receive (ll_buffer.h's credit rule), then
      // stores in the LL order; no other fence is needed: the reader's slot is written only here.
#pragma unroll
      for (int k = 0; k < kPeerWindow; ++k) {
        const int q = q0 + k;
        if (q < q1 && q != a.rank) buf.template sendToSlot<T>(q, reader_slot, v);
      }
      if (ahead_active) ahead = load_pack<T, sizeof(P)>(in, line_of(base + per_iter) * kElems, a.n, in_aligned);
      if (g == 0) got[a.rank * lb + j] = v;  // LL carries the bits as they are: every rank sums these
      ok = buf.template recvWindow<T>(1, q0, [&](int q, int, const P& x) { got[q * lb + j] = x; });
    }
    // Every line of the pass is in `got` after this barrier, and every thread learns whether any
    // thread of the block met a fault (recorded: every rank learns of it); then no commit.
    if (sync_working_any(working, !ok)) return poison_from(base);
    if (active && g == 0) {
      P res;
      acc_to_pack(reduce_rank_order<T, Op, P, A, kMaxRanks>(got, R, lb, j), res);
      store_pack<T, sizeof(P)>(out, line_of(base) * kElems, a.n, out_aligned, res);
    }
    buf.advanceEpoch();
    if (!ahead_any) break;  // the same in every thread: no later pass, so no reuse of `got` to wait for
    sync_working(working);  // `got` is read before the next pass writes it
    v = ahead;
  }
  buf.commit();
}

__device__ __forceinline__ void oneshot_wide_body(const CallArgs& a, const SOLLAT_T* in, SOLLAT_T* out) {
  oneshot_wide<SOLLAT_T, SOLLAT_OP, SOLLAT_MAX_RANKS>(a, in, out);
}
SOLLAT_DEFINE_ENTRY_POINTS(oneshot_wide, SOLLAT_T, oneshot_wide_body)
