// Barrier-cost probe and the empty kernel (the launch floor), docs/measurement.md.
//
// sollat_barrier_a2a is the unicast all-to-all flag barrier that barrier-based one-shot and
// two-shot kernels use, in the shape of NCCL's ncclLsaBarrierSession (unicast path): every rank
// keeps one 4-byte inbox word per peer; to arrive it stores epoch+1 into its word of every
// peer's inbox, to wait it polls its own inbox until every peer's word has reached epoch+1.
//
//   inbox of rank d (u32[nranks], one allocation per rank; inbox_ptrs[d] is its address)
//   +---------+---------+-----+-------------------+
//   | from 0  | from 1  | ... | from nranks-1     |   word s: written by rank s only
//   +---------+---------+-----+-------------------+
//
// | word        | writer      | scope | meaning                                  | at rest |
// |-------------|-------------|-------|------------------------------------------|---------|
// | inbox[d][s] | rank s      | sys   | the last barrier rank s arrived at        | epoch   |
// | epochs[r]   | rank r, end | gpu   | barriers rank r has completed (per launch) | -       |
//
// A peer can run at most one barrier ahead (it cannot pass barrier k+1 before this rank
// arrives at it), so a word can already hold epoch+2 when this rank polls for epoch+1; the
// wait therefore accepts any value that is not behind (rolling compare, as NCCL does).
//
// Virtual ranks: rank = rank_base + blockIdx.y, one block per rank, all in one launch (all
// blocks must be resident at once; the host keeps nranks far below the SM count). Multi-GPU:
// one block per process, rank_base = its rank, inbox_ptrs are peer-mapped addresses.
//
// order 0 = relaxed (st.volatile / ld.volatile: the cost of the signal alone, the setting the
// paper measured NCCL's barrier with); order 1 = release/acquire at system scope (what a
// barrier that also publishes data needs). Every poll is a bounded Spin (sollat/fault.h).
//
// Output per rank r: times[2r] = ns of the `iters` timed barriers (after `warm` untimed ones,
// which absorb launch skew), times[2r+1] = SM cycles of the same.
#include "sollat/fault.h"

using namespace sollat;

namespace {

template <int kOrder>
__device__ __forceinline__ void signal(u32* p, u32 v) {
  if (kOrder == 0) st<Order::Volatile, Scope::Sys>(p, v);
  else st<Order::Release, Scope::Sys>(p, v);
}
template <int kOrder>
__device__ __forceinline__ u32 observe(const u32* p) {
  return kOrder == 0 ? ld<Order::Volatile, Scope::Sys>(p) : ld<Order::Acquire, Scope::Sys>(p);
}

// One barrier. Returns false when a wait gave up (the fault record says who was missing).
template <int kOrder>
__device__ __forceinline__ bool barrier_once(u32* const* inboxes, int rank, int nranks, u32 e, const FaultSink& sink) {
  for (int p = threadIdx.x; p < nranks; p += blockDim.x)
    if (p != rank) signal<kOrder>(inboxes[p] + rank, e);
  const u32* mine = inboxes[rank];
  for (int p = threadIdx.x; p < nranks; p += blockDim.x) {
    if (p == rank) continue;
    Spin spin(sink);
    while ((int)(observe<kOrder>(mine + p) - e) < 0)
      if (!spin.again(rank, p, p, e)) return false;
  }
  return true;
}

template <int kOrder>
__device__ void barrier_loop(u32* const* inboxes, int rank, int nranks, u32* epochs, int warm, int iters,
                             u64* times, const FaultSink& sink) {
  const u32 base = epochs[rank];
  u64 t0 = 0, c0 = 0;
  bool ok = true;
#pragma unroll 1
  for (int i = 0; i < warm + iters; ++i) {
    if (i == warm && threadIdx.x == 0) {
      t0 = globaltimer();
      c0 = sm_clock64();
    }
    ok = barrier_once<kOrder>(inboxes, rank, nranks, base + (u32)i + 1u, sink);
    // The block leaves together: every thread has seen its peers before any signals again.
    if (__syncthreads_or(!ok)) break;
  }
  if (threadIdx.x == 0) {
    times[2 * rank] = globaltimer() - t0;
    times[2 * rank + 1] = sm_clock64() - c0;
    epochs[rank] = base + (u32)(warm + iters);
  }
}

}  // namespace

// inbox_ptrs: u64[nranks] (device) addresses of every rank's inbox; epochs: u32[nranks];
// times: u64[2 * nranks]; fault_dev: int[8].
extern "C" __global__ void sollat_barrier_a2a(const u64* inbox_ptrs, int rank_base, int nranks, u32* epochs,
                                              int warm, int iters, int order, u64* times, int* fault_dev,
                                              u64 timeout_ns) {
  const int rank = rank_base + (int)blockIdx.y;
  u32* const* inboxes = reinterpret_cast<u32* const*>(inbox_ptrs);
  const FaultSink sink{(u32*)fault_dev, nullptr, timeout_ns, nullptr, 0};
  if (order == 0) barrier_loop<0>(inboxes, rank, nranks, epochs, warm, iters, times, sink);
  else barrier_loop<1>(inboxes, rank, nranks, epochs, warm, iters, times, sink);
}

// The floor: what one launch costs when the kernel does nothing (timed in a CUDA graph of
// back-to-back launches, with and without programmatic dependent launch).
extern "C" __global__ void sollat_empty() {}
