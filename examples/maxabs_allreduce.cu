// AllReduce of max(|x|) over ranks, written with sollat's device API (docs/custom-collectives.md).
// The host (examples/maxabs_allreduce.py, sollat.custom.Collective) sets SOLLAT_T, SOLLAT_PROTO,
// SOLLAT_MAX_RANKS, SOLLAT_SLOTS and SOLLAT_BUFFERS, and launches the entry point <name>.
#include <sollat/collective.h>

using namespace sollat;

constexpr int kBuffers = SOLLAT_BUFFERS;  // the entry point's epoch stride per launch rank: Collective(buffers=1)

// The user's operator, on the accumulation type (fp32 for 16-bit types). recvReduce starts from
// rank 0's value and applies it for ranks 1..R-1, so |.| is taken inside. NaN propagates.
struct OpMaxAbs {
  template <typename A> __device__ static A abs_(A v) { return v < A(0) ? -v : v + A(0); }  // |-0| = +0
  template <typename A> __device__ static A apply(A a, A b) { return OpMax::apply(abs_(a), abs_(b)); }
};

template <typename T, class Proto, int kMaxRanks, int kSlots>
__device__ void maxabs(const CallArgs& a, const T* in, T* out) {
  typedef LLBuffer<Proto, kMaxRanks, kSlots> Buf;
  typedef typename Buf::template PackT<T> P;
  typedef typename Buf::template AccT<T> A;
  const u64 lines = (a.n + P::kElems - 1) / P::kElems, step = (u64)gridDim.x * blockDim.x * kSlots;
  const bool ia = is_aligned(in, sizeof(P)), oa = is_aligned(out, sizeof(P));
  auto line = [&](u64 base, int i) { return base + ((u64)blockIdx.x * kSlots + i) * blockDim.x + threadIdx.x; };
  auto poison_from = [&](u64 base) {  // a faulted call: NaN in every line this thread still owns
    for (u64 b = base; b < lines; b += step)
      for (int i = 0; i < kSlots; ++i)
        if (line(b, i) < lines) store_pack<T, sizeof(P)>(out, line(b, i) * P::kElems, a.n, oa, nan_pack<T, sizeof(P)>());
  };
  if (line(0, 0) >= lines) return;           // no line for this thread: its channels keep their epochs
  if (refused(a)) return poison_from(0);     // the communicator holds a fault: send nothing
  Buf buf(make_desc<kMaxRanks>(a, 0, region_bytes(a.nranks, a.lines_per_src)), make_fault(a),
          slot_index(blockIdx.x, 0, threadIdx.x));
  for (u64 base = 0; line(base, 0) < lines; base += step) {  // one epoch per pass
    P own[kSlots];
    A acc[kSlots];
    int active = 0;
#pragma unroll
    for (int i = 0; i < kSlots; ++i)
      if (line(base, i) < lines) {
        own[i] = buf.template bcast<T>(i, load_pack<T, sizeof(P)>(in, line(base, i) * P::kElems, a.n, ia));
        active = i + 1;
      }
    if (!buf.template recvReduce<T, OpMaxAbs>(active, own, acc)) return poison_from(base);  // fault recorded
#pragma unroll
    for (int i = 0; i < kSlots; ++i)
      if (i < active) {
        P r;
        acc_to_pack(acc[i], r);
        store_pack<T, sizeof(P)>(out, line(base, i) * P::kElems, a.n, oa, r);
      }
    buf.advanceEpoch();
  }
  buf.commit();
}

__device__ __forceinline__ void maxabs_body(const CallArgs& a, const SOLLAT_T* in, SOLLAT_T* out) {
  maxabs<SOLLAT_T, SOLLAT_PROTO, SOLLAT_MAX_RANKS, SOLLAT_SLOTS>(a, in, out);
}
SOLLAT_DEFINE_ENTRY_POINTS(maxabs, SOLLAT_T, maxabs_body)
