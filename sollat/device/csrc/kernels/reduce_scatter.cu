// Built-in ReduceScatter, one-shot push, barrier-free, written with the LLBuffer device API
// (sollat/collectives/gather_scatter.py, comm.reduce_scatter). Each rank's input of n = nranks * m elements
// is cut into nranks chunks of m (the host checks divisibility): chunk j goes to rank j. A thread
// owns line `ln` of the chunk: it sends line ln of chunk j to rank j (send, one line per peer
// and epoch, like bcast but with different data per peer), keeps line ln of its own chunk, and
// reduces the peers' lines with it in rank order 0..nranks-1 (recvReduce: fp32 accumulation for
// 16-bit types, one rounding), so the result equals a rank-order reference bitwise. Data sent
// per rank (R-1)*m (sentinel) or 2(R-1)*m (LL). One epoch per pass, as the one-shot AllReduce.
//
// Module defines (sollat/collectives/algorithms.py): SOLLAT_T, SOLLAT_OP (OpSum, OpMax, OpMin),
// SOLLAT_PROTO, SOLLAT_MAX_RANKS, SOLLAT_SLOTS. Kernel: reduce_scatter
// (collective.h). `out` holds m = n / nranks elements.
#include "sollat/collective.h"

using namespace sollat;

constexpr int kBuffers = kReduceScatterBuffers;  // abi.h (sollat/device/abi.py KERNELS)

template <typename T, class Op, class Proto, int kMaxRanks, int kSlots>
__device__ __forceinline__ void reduce_scatter(const CallArgs& a, const T* in, T* out) {
  typedef LLBuffer<Proto, kMaxRanks, kSlots> Buf;
  typedef typename Buf::template PackT<T> P;
  typedef typename Buf::template AccT<T> A;
  const u64 m = ceil_div_ranks<kMaxRanks>(a.n, a.nranks);  // exact: the host passes n divisible by nranks
  const u64 lines = (m + P::kElems - 1) / P::kElems, step = (u64)gridDim.x * blockDim.x * kSlots;
  const bool oa = is_aligned(out, sizeof(P));
  auto line = [&](u64 base, int i) { return base + ((u64)blockIdx.x * kSlots + i) * blockDim.x + threadIdx.x; };
  auto poison_from = [&](u64 base) {  // a faulted call: NaN in every line this thread still owns
    for (u64 b = base; b < lines; b += step)
      for (int i = 0; i < kSlots; ++i)
        if (line(b, i) < lines) store_pack<T, sizeof(P)>(out, line(b, i) * P::kElems, m, oa, nan_pack<T, sizeof(P)>());
  };
  if (line(0, 0) >= lines) return;        // no line for this thread: its channels keep their epochs
  if (refused(a)) return poison_from(0);  // the communicator holds a fault: send nothing
  Buf buf(make_desc<kMaxRanks>(a, 0, region_bytes(a.nranks, a.lines_per_src)), make_fault(a),
          slot_index(blockIdx.x, 0, threadIdx.x));
  for (u64 base = 0; line(base, 0) < lines; base += step) {  // one epoch per pass
    P own[kSlots];
    A acc[kSlots];
    int active = 0;
#pragma unroll
    for (int i = 0; i < kSlots; ++i)
      if (line(base, i) < lines) {
        const u64 e0 = line(base, i) * P::kElems;
#pragma unroll  // fully up to kPeerWindow ranks; a wide group loops (the trip count is R)
        for (int j = 0; j < (Buf::kWide ? a.nranks : kMaxRanks); ++j) {
          if (j >= a.nranks) continue;
          const T* chunk = in + (u64)j * m;  // rank j's chunk (each chunk's alignment checked)
          const P v = load_pack<T, sizeof(P)>(chunk, e0, m, is_aligned(chunk, sizeof(P)));
          if (j == a.rank) own[i] = v;
          else buf.template send<T>(j, i, v);
        }
        active = i + 1;
      }
    if (!buf.template recvReduce<T, Op>(active, own, acc)) return poison_from(base);  // fault recorded
#pragma unroll
    for (int i = 0; i < kSlots; ++i)
      if (i < active) {
        P r;
        acc_to_pack(acc[i], r);
        store_pack<T, sizeof(P)>(out, line(base, i) * P::kElems, m, oa, r);
      }
    buf.advanceEpoch();
  }
  buf.commit();
}

__device__ __forceinline__ void reduce_scatter_body(const CallArgs& a, const SOLLAT_T* in, SOLLAT_T* out) {
  reduce_scatter<SOLLAT_T, SOLLAT_OP, SOLLAT_PROTO, SOLLAT_MAX_RANKS, SOLLAT_SLOTS>(a, in, out);
}
SOLLAT_DEFINE_ENTRY_POINTS(reduce_scatter, SOLLAT_T, reduce_scatter_body)
