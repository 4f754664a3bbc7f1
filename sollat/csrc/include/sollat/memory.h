// sollat/memory.h - the few memory instructions the protocols are built from.
//
// Every protocol store is a single 16-byte vector store and every poll a single 16-byte vector
// load, both `.volatile` (PTX treats volatile as relaxed at system scope: never cached in L1,
// never merged or elided, and a 16-byte aligned access is not torn). Ordering beyond a single
// access is stated where each protocol uses these, next to the reason it is enough.
#ifndef SOLLAT_MEMORY_H_
#define SOLLAT_MEMORY_H_

#include "sollat/types.h"

namespace sollat {

__device__ __forceinline__ void st_volatile_line(Line* p, u64 lo, u64 hi) {
  asm volatile("st.volatile.global.v2.b64 [%0], {%1, %2};" ::"l"(p), "l"(lo), "l"(hi) : "memory");
}
__device__ __forceinline__ Line ld_volatile_line(const Line* p) {
  Line l;
  asm volatile("ld.volatile.global.v2.b64 {%0, %1}, [%2];" : "=l"(l.lo), "=l"(l.hi) : "l"(p) : "memory");
  return l;
}
__device__ __forceinline__ u32 ld_volatile_u32(const u32* p) {
  u32 v;
  asm volatile("ld.volatile.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_volatile_u32(u32* p, u32 v) {
  asm volatile("st.volatile.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// Scoped word accesses for the fault record, which several GPUs write (fault.h). Relaxed loads
// and CAS at system scope; the release store makes the record's detail words visible, to any
// observer that sees the code, before the code itself.
__device__ __forceinline__ u32 ld_relaxed_sys_u32(const u32* p) {
  u32 v;
  asm volatile("ld.relaxed.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ u32 atom_cas_relaxed_sys_u32(u32* p, u32 expect, u32 value) {
  u32 old;
  asm volatile("atom.relaxed.sys.global.cas.b32 %0, [%1], %2, %3;" : "=r"(old) : "l"(p), "r"(expect), "r"(value) : "memory");
  return old;
}
__device__ __forceinline__ void st_relaxed_sys_u32(u32* p, u32 v) {
  asm volatile("st.relaxed.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void st_release_sys_u32(u32* p, u32 v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// Orders this thread's earlier memory operations before its later ones. Used only where a
// store to this GPU's own scratch (sentinel reset, LL128 line zeroing) must land before a later
// store that lets a peer write the same location again. The observer is the peer, so real ranks
// (one GPU each) need system scope, which is what PTX's memory model asks for when the
// observing thread runs on another GPU; virtual ranks share one GPU, where gpu scope is the
// right one (measured 135 ns on H200). SOLLAT_FENCE_SYS is set per build (sollat/algorithms.py).
#ifndef SOLLAT_FENCE_SYS
#define SOLLAT_FENCE_SYS 1
#endif
__device__ __forceinline__ void fence_acq_rel_gpu() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }
__device__ __forceinline__ void fence_acq_rel_sys() { asm volatile("fence.acq_rel.sys;" ::: "memory"); }
__device__ __forceinline__ void fence_before_peer_reuse() {
  if (SOLLAT_FENCE_SYS) fence_acq_rel_sys();
  else fence_acq_rel_gpu();
}

// Nanosecond wall clock, for bounding spins (coarse ticks, which is fine for timeouts).
__device__ __forceinline__ u64 globaltimer() {
  u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// This SM's cycle counter (for probes that report cycles beside nanoseconds).
__device__ __forceinline__ u64 sm_clock64() {
  u64 c;
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(c));
  return c;
}

// Programmatic dependent launch. `launch_dependents` lets the next kernel in the stream be
// scheduled now; `wait` blocks until the previous kernel has completed and its memory is
// visible. Both are no-ops when the kernel was not launched with the PDL attribute. No memory
// is touched before `wait`, which is what makes overlapping the launches safe.
__device__ __forceinline__ void pdl_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

}  // namespace sollat

#endif  // SOLLAT_MEMORY_H_
