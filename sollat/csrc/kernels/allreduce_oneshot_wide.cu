// One-shot AllReduce for wide groups (more ranks than the peer window, abi.py PEER_WINDOW), LL
// protocol, written with the LLBuffer device API. The plain one-shot gives each line one thread,
// which stores it to every peer in turn and polls every peer window after window; here a line's
// peers are spread over the block: thread (g, j) handles line j for the peers of group g (ranks
// 8g .. 8g+7). It stores line j to each of them and polls their line j: one window per thread,
// all groups at once. The lines land in shared memory, and thread (0, j) reduces line j in rank
// order 0..R-1 from there. Every rank gets the bits of the rank-order reference, as with every
// deterministic sollat AllReduce.
//
// Channels (ll_buffer.h): thread (g, j) owns slot s(g, j) = slot_index(block, 0, g * lb + j) and its
// epoch counter. Rank r's line j for peer q is written by r's thread (group(q), j) and read by q's
// thread (group(r), j). That reader polls its own slot, so the writer stores into slot
// s(group(r), j) (sendToSlot). These two threads form one credit loop of ll_buffer.h. Each sends
// the other line j and receives line j from it, once per pass, and a receive and the next send
// are separated by the buffer's fence. So a line is written at epoch e + 2 only after its writer
// received e + 1 from its reader, which sent it after reading e. Both threads advance once per
// pass whenever line j exists (the writer's group holds q, the reader's holds r), so their
// epochs agree. A thread whose group holds no peer sends and receives nothing and keeps its
// epoch. Shared memory is reused only after a barrier that follows every read of it.
// (Not in the protocol model: its LL algorithms give each line-channel one thread.)
//
// Geometry (layout.plan_peer_groups): blockDim.x = lb * groups with groups = ceil(R / 8); the host
// keeps lb * R within kPeerGroupPacks (abi.h). Module defines as in allreduce_oneshot.cu (SOLLAT_PROTO is
// ProtoLL, SOLLAT_SLOTS 1, SOLLAT_MAX_RANKS the wide rank cap). Kernel: oneshot_wide (collective.h).
#include "sollat/collective.h"

using namespace sollat;

constexpr int kBuffers = kOneshotWideBuffers;  // abi.h (sollat/abi.py KERNELS)

template <typename T, class Op, int kMaxRanks>
__device__ __forceinline__ void oneshot_wide(const CallArgs& a, const T* in, T* out) {
  typedef LLBuffer<ProtoLL, kMaxRanks, 1> Buf;
  static_assert(Buf::kWide, "oneshot_wide is built for the wide rank cap only");
  typedef typename Buf::template PackT<T> P;
  typedef typename Buf::template AccT<T> A;
  constexpr int kElems = P::kElems;
  __shared__ P got[kPeerGroupPacks];  // [j * R + q]: line j of rank q (abi.h)
  __shared__ int stop;

  const int R = a.nranks;
  const int groups = (R + kPeerWindow - 1) / kPeerWindow;
  const int lb = (int)blockDim.x / groups;  // lines per block and pass
  const int g = (int)threadIdx.x / lb, j = (int)threadIdx.x % lb;
  const int q0 = g * kPeerWindow, q1 = min(q0 + kPeerWindow, R);
  const bool in_aligned = is_aligned(in, sizeof(P)), out_aligned = is_aligned(out, sizeof(P));
  const u64 lines = (a.n + kElems - 1) / kElems;
  const u64 per_iter = (u64)gridDim.x * lb;
  auto line_of = [&](u64 base) { return base + (u64)blockIdx.x * lb + j; };
  // A faulted call leaves NaN in every output line this block has not written yet (from pass
  // `base` on); the reducing threads (g == 0) own the output.
  auto poison_from = [&](u64 base) {
    if (g != 0) return;
    for (u64 b = base; b < lines; b += per_iter)
      if (line_of(b) < lines) store_pack<T, sizeof(P)>(out, line_of(b) * kElems, a.n, out_aligned, nan_pack<T, sizeof(P)>());
  };

  if (refused(a)) return poison_from(0);  // the same answer in every thread: a.prior is the block's
  if (threadIdx.x == 0) stop = 0;
  const FaultSink fault = make_fault(a);
  Buf buf(make_desc<kMaxRanks>(a, 0, region_bytes(R, a.lines_per_src)), fault, slot_index(blockIdx.x, 0, threadIdx.x));
  // The reader of this thread's line at every peer: thread (group of this rank, j).
  const int reader_slot = slot_index(blockIdx.x, 0, (a.rank / kPeerWindow) * lb + j);
  __syncthreads();  // `stop` is cleared before anyone may set it

  for (u64 base = 0; base < lines; base += per_iter) {  // the same passes in every thread of the block
    const u64 line = line_of(base);
    const bool active = line < lines;
    bool ok = true;
    if (active) {
      const P v = load_pack<T, sizeof(P)>(in, line * kElems, a.n, in_aligned);
#pragma unroll
      for (int k = 0; k < kPeerWindow; ++k) {
        const int q = q0 + k;
        if (q < q1 && q != a.rank) buf.template sendToSlot<T>(q, reader_slot, v);
      }
      if (g == 0) got[j * R + a.rank] = v;  // LL carries the bits as they are: every rank sums these
      ok = buf.template recvWindow<T>(1, q0, [&](int q, int, const P& x) { got[j * R + q] = x; });
    }
    if (!ok) stop = 1;  // benign race: every writer stores 1
    __syncthreads();    // every line of the pass is in `got`, and every thread has seen `stop`
    if (stop) return poison_from(base);  // fault recorded (every rank learns of it)
    if (active && g == 0) {
      A acc;
      pack_to_acc(got[j * R], acc);
      for (int q = 1; q < R; ++q) acc_reduce<Op>(acc, got[j * R + q]);  // rank order
      P res;
      acc_to_pack(acc, res);
      store_pack<T, sizeof(P)>(out, line * kElems, a.n, out_aligned, res);
    }
    buf.advanceEpoch();
    __syncthreads();  // `got` is read before the next pass writes it
  }
  buf.commit();
}

__device__ __forceinline__ void oneshot_wide_body(const CallArgs& a, const SOLLAT_T* in, SOLLAT_T* out) {
  oneshot_wide<SOLLAT_T, SOLLAT_OP, SOLLAT_MAX_RANKS>(a, in, out);
}
SOLLAT_DEFINE_ENTRY_POINTS(oneshot_wide, SOLLAT_T, oneshot_wide_body)
