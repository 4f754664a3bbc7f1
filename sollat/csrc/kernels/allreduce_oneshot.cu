// One-shot AllReduce, push mode, barrier-free, written with the LLBuffer device API.
//
// Every rank pushes each of its lines to every peer (bcast), then polls the R-1 incoming lines
// and reduces them with its own in rank order 0..R-1 (recvReduce), so every rank's output is
// bitwise identical. One synchronisation per line, data sent per rank (R-1)*M (sentinel) or
// 2(R-1)*M (LL). Messages larger than one pass are cut into iterations inside the kernel; each
// iteration is one epoch of each line-channel it uses (double buffered, no barrier between).
//
// Module defines (sollat/algorithms.py sets them): SOLLAT_T (element type), SOLLAT_OP (OpSum,
// OpMax, OpMin), SOLLAT_PROTO (ProtoLL, ProtoSentinel), SOLLAT_MAX_RANKS (2, 4, 8: loops over
// peers are unrolled to this) and SOLLAT_SLOTS (1, 2, 4 lines per thread per iteration).
// Kernels: oneshot_pg and oneshot_vr (collective.h).
#include "sollat/collective.h"

using namespace sollat;

constexpr int kBuffers = 1;

// Latency breakdown switch (scripts/latency_breakdown.py only; results are then WRONG on purpose):
// 1 = send but do not wait (output = own data), 2 = no communication (copy input to output),
// 3 = return right after the prologue, 4 = send to and wait for the own rank only (the store ->
// poll trip without any peer's skew). 0 (default) is the real kernel.
#ifndef SOLLAT_BREAKDOWN
#define SOLLAT_BREAKDOWN 0
#endif

template <typename T, class Op, class Proto, int kMaxRanks, int kSlots>
__device__ __forceinline__ void oneshot(const CallArgs& a, const T* in, T* out) {
  typedef LLBuffer<Proto, kMaxRanks, kSlots> Buf;
  typedef typename Buf::template PackT<T> P;
  typedef typename Buf::template AccT<T> A;
  constexpr int kElems = P::kElems;

  if (SOLLAT_BREAKDOWN == 3) return;
  const FaultSink fault = make_fault(a.st);
  const u64 region_bytes = 2ull * a.st->nranks * a.lines_per_src * sizeof(Line);
  Buf buf(make_desc<kMaxRanks>(a, 0, region_bytes), fault, (blockIdx.x * kMaxSlotsPerThread) * kMaxThreads + threadIdx.x);

  const bool in_aligned = is_aligned(in, sizeof(P));
  const bool out_aligned = is_aligned(out, sizeof(P));
  const u64 lines = (a.n + kElems - 1) / kElems;
  const u64 per_iter = (u64)gridDim.x * blockDim.x * kSlots;

  for (u64 base = 0; base < lines; base += per_iter) {
    // Line of slot i: consecutive threads take consecutive lines (coalesced loads and stores).
    P own[kSlots];
    int active = 0;
#pragma unroll
    for (int i = 0; i < kSlots; ++i) {
      const u64 line = base + ((u64)blockIdx.x * kSlots + i) * blockDim.x + threadIdx.x;
      if (line < lines) {
        own[i] = load_pack<T, sizeof(P)>(in, line * kElems, a.n, in_aligned);
        active = i + 1;
      }
    }
    if (active == 0) break;  // later iterations only have higher lines: nothing more for this thread

    if (SOLLAT_BREAKDOWN != 2 && SOLLAT_BREAKDOWN != 4) {
#pragma unroll
      for (int i = 0; i < kSlots; ++i)
        if (i < active) buf.template bcast<T>(i, own[i]);
    }
    A acc[kSlots];
    if (SOLLAT_BREAKDOWN == 4) {
#pragma unroll
      for (int i = 0; i < kSlots; ++i)
        if (i < active) buf.template send<T>(a.rank, i, own[i]);
#pragma unroll
      for (int i = 0; i < kSlots; ++i) {
        P v = own[i];
        if (i < active && !buf.template recv<T>(a.rank, i, v)) return;
        pack_to_acc(v, acc[i]);
      }
    } else if (SOLLAT_BREAKDOWN == 0) {
      if (!buf.template recvReduce<T, Op>(active, own, acc)) return;  // fault recorded; host raises
    } else {
#pragma unroll
      for (int i = 0; i < kSlots; ++i) pack_to_acc(own[i], acc[i]);
    }

#pragma unroll
    for (int i = 0; i < kSlots; ++i) {
      if (i >= active) continue;
      const u64 line = base + ((u64)blockIdx.x * kSlots + i) * blockDim.x + threadIdx.x;
      P res;
      acc_to_pack(acc[i], res);
      store_pack<T, sizeof(P)>(out, line * kElems, a.n, out_aligned, res);
    }
    buf.advanceEpoch();
  }
  buf.commit();
}

__device__ __forceinline__ void oneshot_body(const CallArgs& a, const SOLLAT_T* in, SOLLAT_T* out) {
  oneshot<SOLLAT_T, SOLLAT_OP, SOLLAT_PROTO, SOLLAT_MAX_RANKS, SOLLAT_SLOTS>(a, in, out);
}
SOLLAT_DEFINE_ENTRY_POINTS(oneshot, SOLLAT_T, oneshot_body)
