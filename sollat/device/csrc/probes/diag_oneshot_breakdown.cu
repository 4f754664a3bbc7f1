// DIAGNOSTIC ONLY (scripts/latency_breakdown.py): the one-shot kernel (allreduce_oneshot.cu) cut
// into pieces to see where its time goes at small sizes. Never in the library's instantiations;
// built only through sollat.testing.set_defines(comm, ..., kernel_files={algo: this file}).
// Keep it in step with allreduce_oneshot.cu: same LLBuffer calls, same entry points, so it is
// launched exactly like the one-shot.
//
// SOLLAT_BREAKDOWN (results are then WRONG on purpose):
//   0 = the real kernel (with SOLLAT_PROTO=ProtoLLReset: LL clearing every consumed line),
//   1 = send but do not wait (output = own data), 2 = no communication (copy input to output),
//   3 = return right after the prologue, 4 = send to and wait for the own rank only (the store ->
//   poll trip without any peer's skew).
#include "sollat/collective.h"

using namespace sollat;

constexpr int kBuffers = kOneshotBuffers;  // abi.h (sollat/device/abi.py KERNELS)

#ifndef SOLLAT_BREAKDOWN
#define SOLLAT_BREAKDOWN 0
#endif

namespace sollat {
// LL that clears every consumed line the way the sentinel protocol must (flag 0 is never valid,
// so results stay right): measures what the sentinel's resets cost, everything else being LL.
struct ProtoLLReset : ProtoLL {
  static constexpr bool kNeedsReset = true;
  static constexpr const char* kName = "ll+reset";
  __device__ __forceinline__ static void reset(Line* own) { st<Order::Volatile, Scope::Sys>(own, Line{0ull, 0ull}); }
};
}  // namespace sollat

template <typename T, class Op, class Proto, int kMaxRanks, int kSlots>
__device__ __forceinline__ void oneshot(const CallArgs& a, const T* in, T* out) {
  typedef LLBuffer<Proto, kMaxRanks, kSlots> Buf;
  typedef typename Buf::template PackT<T> P;
  typedef typename Buf::template AccT<T> A;
  constexpr int kElems = P::kElems;

  if (SOLLAT_BREAKDOWN == 3) return;
  const bool in_aligned = is_aligned(in, sizeof(P));
  const bool out_aligned = is_aligned(out, sizeof(P));
  const u64 lines = (a.n + kElems - 1) / kElems;
  const u64 per_iter = (u64)gridDim.x * blockDim.x * kSlots;
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
  auto poison_from = [&](u64 base) {
    for (u64 b = base; b < lines; b += per_iter)
#pragma unroll
      for (int i = 0; i < kSlots; ++i) {
        const u64 line = line_of(b, i);
        if (line < lines) store_pack<T, sizeof(P)>(out, line * kElems, a.n, out_aligned, nan_pack<T, sizeof(P)>());
      }
  };

  P own[kSlots];
  int active = load_own(0, own);
  if (active == 0) return;
  if (refused(a)) return poison_from(0);
  const FaultSink fault = make_fault(a);
  Buf buf(make_desc<kMaxRanks>(a, 0, region_bytes(a.nranks, a.lines_per_src)), fault,
          slot_index(blockIdx.x, 0, threadIdx.x));

  for (u64 base = 0;;) {
    if (SOLLAT_BREAKDOWN != 2 && SOLLAT_BREAKDOWN != 4) {
#pragma unroll
      for (int i = 0; i < kSlots; ++i)
        if (i < active) own[i] = buf.template bcast<T>(i, own[i]);
    }
    const u64 next = base + per_iter;
    P ahead[kSlots];
    const int ahead_active = next < lines ? load_own(next, ahead) : 0;
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
      if (!buf.template recvReduce<T, Op>(active, own, acc)) return poison_from(base);
    } else {
#pragma unroll
      for (int i = 0; i < kSlots; ++i) pack_to_acc(own[i], acc[i]);
    }

#pragma unroll
    for (int i = 0; i < kSlots; ++i) {
      if (i >= active) continue;
      P res;
      acc_to_pack(acc[i], res);
      store_pack<T, sizeof(P)>(out, line_of(base, i) * kElems, a.n, out_aligned, res);
    }
    buf.advanceEpoch();
    if (ahead_active == 0) break;
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
