// One-shot AllReduce, push mode, barrier-free, written with the LLBuffer device API.
//
// Every rank pushes each of its lines to every peer (bcast), then polls the R-1 incoming lines
// and reduces them with its own in rank order 0..R-1 (recvReduce), so every rank's output is
// bitwise identical. One synchronisation per line, data sent per rank (R-1)*M (sentinel) or
// 2(R-1)*M (LL). Messages larger than one pass are cut into iterations inside the kernel; each
// iteration is one epoch of each line-channel it uses (double buffered, no barrier between).
//
// Module defines (sollat/collectives/algorithms.py sets them): SOLLAT_T (element type), SOLLAT_OP (OpSum,
// OpMax, OpMin), SOLLAT_PROTO (ProtoLL, ProtoSentinel), SOLLAT_MAX_RANKS (abi.py RANK_CAPS: up to
// PEER_WINDOW, loops over peers are unrolled to it; above, a wide group) and SOLLAT_SLOTS (1, 2, 4
// lines per thread per iteration).
// Kernel: oneshot (collective.h).
#include "sollat/collective.h"

using namespace sollat;

constexpr int kBuffers = kOneshotBuffers;  // abi.h (sollat/device/abi.py KERNELS)

template <typename T, class Op, class Proto, int kMaxRanks, int kSlots>
__device__ __forceinline__ void oneshot(const CallArgs& a, const T* in, T* out) {
  typedef LLBuffer<Proto, kMaxRanks, kSlots> Buf;
  typedef typename Buf::template PackT<T> P;
  typedef typename Buf::template AccT<T> A;
  constexpr int kElems = P::kElems;
  // A wide LL group polls two windows of peers per poll set (16 lines of one slot: the build has
  // the registers); sentinel builds would spill their signature words.
  constexpr int kRecvWindows = Buf::kWide && !Buf::kSig && kSlots == 1 ? 2 : 1;

  const bool in_aligned = is_aligned(in, sizeof(P));
  const bool out_aligned = is_aligned(out, sizeof(P));
  const u64 lines = (a.n + kElems - 1) / kElems;
  const u64 per_iter = (u64)gridDim.x * blockDim.x * kSlots;
  // Line of slot i: consecutive threads take consecutive lines (coalesced loads and stores).
  auto line_of = [&](u64 base, int i) { return base + ((u64)blockIdx.x * kSlots + i) * blockDim.x + threadIdx.x; };
  auto load_own = [&](u64 base, P (&own)[kSlots]) {
    int active = 0;
#pragma unroll
    for (int i = 0; i < kSlots; ++i) {
      const u64 line = line_of(base, i);
      if (line < lines) {
        own[i] = load_pack<T, sizeof(P)>(in, line * kElems, a.n, in_aligned);
        active = i + 1;
      }
    }
    return active;
  };

  // A faulted call leaves NaN in every output line this thread has not written yet (from
  // iteration `base` on), never a stale or partial value.
  auto poison_from = [&](u64 base) {
    for (u64 b = base; b < lines; b += per_iter)
#pragma unroll
      for (int i = 0; i < kSlots; ++i) {
        const u64 line = line_of(b, i);
        if (line < lines) store_pack<T, sizeof(P)>(out, line * kElems, a.n, out_aligned, nan_pack<T, sizeof(P)>());
      }
  };

  // The first input loads are issued before the buffer is set up: the descriptor and epoch
  // loads below then travel together with them (one memory latency before the first send, not
  // two; the scratch bases are loaded from CommState and used at once).
  P own[kSlots];
  int active = load_own(0, own);
  if (active == 0) return;  // no line for this thread: its channels keep their epochs
  if (refused(a)) return poison_from(0);
  const FaultSink fault = make_fault(a);
  Buf buf(make_desc<kMaxRanks>(a, 0, region_bytes(a.nranks, a.lines_per_src)), fault,
          slot_index(blockIdx.x, 0, threadIdx.x));

  for (u64 base = 0;;) {
    // Own lines as the peers receive them, so that every rank reduces the same bits.
#pragma unroll
    for (int i = 0; i < kSlots; ++i)
      if (i < active) own[i] = buf.template bcast<T>(i, own[i]);
    // Next iteration's input, loaded now so that it is in flight while this one waits for its
    // peers (polls are volatile asm, which later loads could not be hoisted over). Safe in
    // place: this thread writes only its own lines, and these are other lines.
    const u64 next = base + per_iter;
    P ahead[kSlots];
    const int ahead_active = next < lines ? load_own(next, ahead) : 0;
    A acc[kSlots];
    if (!buf.template recvReduce<T, Op, kRecvWindows>(active, own, acc)) return poison_from(base);  // fault recorded

#pragma unroll
    for (int i = 0; i < kSlots; ++i) {
      if (i >= active) continue;
      P res;
      acc_to_pack(acc[i], res);
      store_pack<T, sizeof(P)>(out, line_of(base, i) * kElems, a.n, out_aligned, res);
    }
    buf.advanceEpoch();
    if (ahead_active == 0) break;  // later iterations only have higher lines: nothing more for this thread
    base = next;
    active = ahead_active;
#pragma unroll
    for (int i = 0; i < kSlots; ++i) own[i] = ahead[i];
  }
  buf.commit();
}

__device__ __forceinline__ void oneshot_body(const CallArgs& a, const SOLLAT_T* in, SOLLAT_T* out) {
  oneshot<SOLLAT_T, SOLLAT_OP, SOLLAT_PROTO, SOLLAT_MAX_RANKS, SOLLAT_SLOTS>(a, in, out);
}
SOLLAT_DEFINE_ENTRY_POINTS(oneshot, SOLLAT_T, oneshot_body)
