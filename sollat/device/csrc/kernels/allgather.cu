// Built-in AllGather, one-shot push, barrier-free, written with the LLBuffer device API
// (sollat/collectives/gather_scatter.py, comm.all_gather): every rank broadcasts each line of its n input
// elements to every peer (bcast) and writes rank r's line at out[r * n + ...] as it arrives
// (recvEach); its own lines it writes from the pack bcast returned (the sentinel protocol
// canonicalises NaNs on the wire, so every rank's out[r] has the same bits). One epoch of each
// line-channel per pass; messages larger than one pass iterate inside the kernel.
//
// Module defines (sollat/collectives/algorithms.py): SOLLAT_T, SOLLAT_PROTO, SOLLAT_MAX_RANKS, SOLLAT_SLOTS;
// no SOLLAT_OP. Kernel: allgather (collective.h). `out` holds nranks * n
// elements; rank r's data lands at element r * n (any alignment: each row is checked).
#include "sollat/collective.h"

using namespace sollat;

constexpr int kBuffers = kAllgatherBuffers;  // abi.h (sollat/device/abi.py KERNELS)

template <typename T, class Proto, int kMaxRanks, int kSlots>
__device__ __forceinline__ void allgather(const CallArgs& a, const T* in, T* out) {
  typedef LLBuffer<Proto, kMaxRanks, kSlots> Buf;
  typedef typename Buf::template PackT<T> P;
  const u64 lines = (a.n + P::kElems - 1) / P::kElems, step = (u64)gridDim.x * blockDim.x * kSlots;
  const bool ia = is_aligned(in, sizeof(P));
  auto line = [&](u64 base, int i) { return base + ((u64)blockIdx.x * kSlots + i) * blockDim.x + threadIdx.x; };
  auto put = [&](int r, u64 ln, const P& v) {  // rank r's line ln into its row of out
    T* dst = out + (u64)r * a.n;
    store_pack<T, sizeof(P)>(dst, ln * P::kElems, a.n, is_aligned(dst, sizeof(P)), v);
  };
  // A faulted call: NaN in every position this thread still owns (every rank's row), never a
  // stale or partial value.
  auto poison_from = [&](u64 base) {
    for (u64 b = base; b < lines; b += step)
      for (int i = 0; i < kSlots; ++i)
        for (int r = 0; r < a.nranks; ++r)
          if (line(b, i) < lines) put(r, line(b, i), nan_pack<T, sizeof(P)>());
  };
  if (line(0, 0) >= lines) return;        // no line for this thread: its channels keep their epochs
  if (refused(a)) return poison_from(0);  // the communicator holds a fault: send nothing
  Buf buf(make_desc<kMaxRanks>(a, 0, region_bytes(a.nranks, a.lines_per_src)), make_fault(a),
          slot_index(blockIdx.x, 0, threadIdx.x));
  for (u64 base = 0; line(base, 0) < lines; base += step) {  // one epoch per pass
    int active = 0;
#pragma unroll
    for (int i = 0; i < kSlots; ++i)
      if (line(base, i) < lines) {  // own line: to every peer, and into its own row
        const P v = load_pack<T, sizeof(P)>(in, line(base, i) * P::kElems, a.n, ia);
        put(a.rank, line(base, i), buf.template bcast<T>(i, v));
        active = i + 1;
      }
    const bool ok = buf.template recvEach<T>(active, [&](int r, int i, const P& v) { put(r, line(base, i), v); });
    if (!ok) return poison_from(base);  // fault recorded (every rank learns of it)
    buf.advanceEpoch();
  }
  buf.commit();
}

__device__ __forceinline__ void allgather_body(const CallArgs& a, const SOLLAT_T* in, SOLLAT_T* out) {
  allgather<SOLLAT_T, SOLLAT_PROTO, SOLLAT_MAX_RANKS, SOLLAT_SLOTS>(a, in, out);
}
SOLLAT_DEFINE_ENTRY_POINTS(allgather, SOLLAT_T, allgather_body)
