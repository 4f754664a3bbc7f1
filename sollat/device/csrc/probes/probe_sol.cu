// Speed-of-light probes: the latencies the SoL floor is built from (docs/measurement.md).
//
//   SoL = 2 * L2 round trip + remote store
//
// Every probe runs on one thread (or one thread per participating block), times itself with
// %globaltimer (ns) and clock64 (SM cycles), and writes raw totals; the host divides by the
// iteration count and takes the median over repeated launches.
//
// Kernels (one launch = one sample):
//   sollat_probe_fence     a dependent chain of fences (L2 round trip: `__threadfence()` is
//                          `fence.sc.gpu`; it cannot retire before L2 acknowledges it)
//   sollat_probe_chase     a dependent chain of `ld.volatile.global.u32` (pointer chase over
//                          L2-resident lines; the cross-check of the fence figure)
//   sollat_probe_pingpong  a flag ping-pong between two blocks, or between two launches on two
//                          GPUs: st.volatile of a counter into the peer's inbox, then a bounded
//                          poll of the own inbox (remote store latency = round trip / 2)
//
// Output words (u64) of every probe: [0] elapsed ns  [1] elapsed cycles  [2] iterations
// [3] %smid of the timing thread  [4] %smid of the responder (ping-pong only, in the
// responder's own output buffer).
#include "sollat/fault.h"

using namespace sollat;

namespace {

__device__ __forceinline__ u32 smid() {
  u32 s;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
  return s;
}

// Fence flavours. 0: fence.sc.gpu (= __threadfence), 1: fence.acq_rel.gpu, 2: fence.sc.sys
// (= __threadfence_system). Each body is unrolled x8 so the loop branch is noise.
template <int kMode>
__device__ __forceinline__ void fence_once() {
  if (kMode == 0) fence<Scope::Gpu, Order::SeqCst>();
  if (kMode == 1) fence<Scope::Gpu>();
  if (kMode == 2) fence<Scope::Sys, Order::SeqCst>();
}

template <int kMode>
__device__ __forceinline__ void fence_loop(int iters) {
#pragma unroll 1
  for (int i = 0; i < iters; i += 8) {
#pragma unroll
    for (int j = 0; j < 8; ++j) fence_once<kMode>();
  }
}

__device__ __forceinline__ void record(u64* out, u64 ns, u64 cycles, u64 iters) {
  out[0] = ns;
  out[1] = cycles;
  out[2] = iters;
  out[3] = smid();
}

}  // namespace

// iters must be a multiple of 8 (the host rounds it).
extern "C" __global__ void sollat_probe_fence(u64* out, int iters, int mode) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  const u64 t0 = globaltimer();
  const u64 c0 = sm_clock64();
  if (mode == 0) fence_loop<0>(iters);
  else if (mode == 1) fence_loop<1>(iters);
  else fence_loop<2>(iters);
  const u64 c1 = sm_clock64();
  const u64 t1 = globaltimer();
  record(out, t1 - t0, c1 - c0, (u64)iters);
}

// next[i] is the index of the next word to load; the host builds one random cycle over words
// 128 bytes apart, so every load is a different L2 line and no load can start before the
// previous one returns. Volatile loads bypass L1, so a warm chain measures the L2 round trip.
// The last index goes to sink so the chain cannot be optimised away.
extern "C" __global__ void sollat_probe_chase(const u32* next, int iters, u64* out, u32* sink) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  u32 idx = 0;
  const u64 t0 = globaltimer();
  const u64 c0 = sm_clock64();
#pragma unroll 1
  for (int i = 0; i < iters; i += 8) {
#pragma unroll
    for (int j = 0; j < 8; ++j) idx = ld<Order::Volatile, Scope::Sys>(next + idx);
  }
  const u64 c1 = sm_clock64();
  const u64 t1 = globaltimer();
  sink[0] = idx;
  record(out, t1 - t0, c1 - c0, (u64)iters);
}

// Ping-pong between role 0 (initiator, timed) and role 1 (responder). role = role_base +
// blockIdx.x: one launch of two blocks gives SM-to-SM on one GPU; two one-block launches
// (role_base 0 on GPU a, 1 on GPU b, inboxes on their own GPUs) give GPU-to-GPU, where every
// store crosses the link and every poll is local. Inboxes sit on their own 128-byte lines and
// are zero at launch (the host clears them). Round i: the initiator stores i into the
// responder's inbox and polls its own until it reads i; the responder polls for i and answers
// with i. `warm` untimed rounds first absorb the launch skew between the two sides.
// fault_dev: int[8] error record (sollat/fault.h); every poll gives up after timeout_ns.
extern "C" __global__ void sollat_probe_pingpong(u32* inbox0, u32* inbox1, int role_base, int iters, int warm,
                                                 u64* out, int* fault_dev, u64 timeout_ns) {
  if (threadIdx.x != 0) return;
  const int role = role_base + (int)blockIdx.x;
  u32* mine = role == 0 ? inbox0 : inbox1;
  u32* peer = role == 0 ? inbox1 : inbox0;
  const FaultSink sink{(u32*)fault_dev, nullptr, timeout_ns, nullptr, 0};
  const int total = warm + iters;
  u64 t0 = 0, c0 = 0;
#pragma unroll 1
  for (int i = 1; i <= total; ++i) {
    if (role == 0 && i == warm + 1) {
      t0 = globaltimer();
      c0 = sm_clock64();
    }
    if (role == 0) st<Order::Volatile, Scope::Sys>(peer, (u32)i);
    Spin spin(sink);
    // Relaxed polls are enough: the counter is the only datum and a 4-byte store is not torn.
    while (ld<Order::Volatile, Scope::Sys>(mine) != (u32)i)
      if (!spin.again(role, 1 - role, 0, (u32)i)) return;
    if (role == 1) st<Order::Volatile, Scope::Sys>(peer, (u32)i);
  }
  if (role == 0) {
    const u64 c1 = sm_clock64();
    const u64 t1 = globaltimer();
    record(out, t1 - t0, c1 - c0, (u64)iters);
  } else {
    out[4] = smid();  // the responder's SM, for the report
  }
}
