// AllGather written with sollat's device API (docs/custom-collectives.md): every rank's n elements
// land at out[r * n .. (r + 1) * n) on every rank. Host: examples/allgather.py (output="gather").
#include <sollat/collective.h>

using namespace sollat;

constexpr int kBuffers = SOLLAT_BUFFERS;  // Collective(buffers=1)

template <typename T, class Proto, int kMaxRanks, int kSlots>
__device__ void allgather(const CallArgs& a, const T* in, T* out) {
  typedef LLBuffer<Proto, kMaxRanks, kSlots> Buf;
  typedef typename Buf::template PackT<T> P;
  const u64 lines = (a.n + P::kElems - 1) / P::kElems, step = (u64)gridDim.x * blockDim.x * kSlots;
  const bool ia = is_aligned(in, sizeof(P));
  auto line = [&](u64 base, int i) { return base + ((u64)blockIdx.x * kSlots + i) * blockDim.x + threadIdx.x; };
  auto put = [&](int r, u64 ln, const P& v) {  // rank r's line ln into its place in out
    T* dst = out + (u64)r * a.n;
    store_pack<T, sizeof(P)>(dst, ln * P::kElems, a.n, is_aligned(dst, sizeof(P)), v);
  };
  auto poison_from = [&](u64 base) {  // a faulted call: NaN in every position this thread still owns
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
      if (line(base, i) < lines) {  // own line: to every peer, and (as they receive it) into out
        put(a.rank, line(base, i), buf.template bcast<T>(i, load_pack<T, sizeof(P)>(in, line(base, i) * P::kElems, a.n, ia)));
        active = i + 1;
      }
    const bool ok = buf.template recvEach<T>(active, [&](int r, int i, const P& v) { put(r, line(base, i), v); });
    if (!ok) return poison_from(base);  // fault recorded
    buf.advanceEpoch();
  }
  buf.commit();
}

__device__ __forceinline__ void allgather_body(const CallArgs& a, const SOLLAT_T* in, SOLLAT_T* out) {
  allgather<SOLLAT_T, SOLLAT_PROTO, SOLLAT_MAX_RANKS, SOLLAT_SLOTS>(a, in, out);
}
SOLLAT_DEFINE_ENTRY_POINTS(allgather, SOLLAT_T, allgather_body)
