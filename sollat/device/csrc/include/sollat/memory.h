// sollat/memory.h - the memory instructions the protocols are built from, each with its memory
// order and scope as template parameters (as NCCL's device API takes them), so every call site
// states the ordering it relies on:
//
//   ld<Order::Volatile, Scope::Sys>(line)       st<Order::Release, Scope::Sys>(word, v)
//   atom_cas<Order::Relaxed, Scope::Sys>(...)   red_add_v4<Order::Relaxed, Scope::Sys>(...)
//   fence<Scope::Gpu>()  (acq_rel)              fence<Scope::Sys, Order::SeqCst>()
//
// Order::Volatile is PTX's `.volatile`: relaxed at system scope, never cached in L1, never merged
// or elided (so it takes Scope::Sys only). Every protocol line is one 16-byte vector access (one
// instruction), which PTX's memory model treats as two 8-byte accesses performed in no particular
// order: only each aligned 8-byte word is single-copy atomic, and the protocols rely on no more
// (protocol_ll.h: a flag in every word; protocol_sentinel.h: every element is checked). Forms an
// order does not allow (a release load, an acquire store) do not exist: using one is a compile
// error. Weak accesses (ld_weak_l2, st_weak) carry data that a release/acquire pair publishes.
#ifndef SOLLAT_MEMORY_H_
#define SOLLAT_MEMORY_H_

#include "sollat/types.h"

namespace sollat {

enum class Order { Volatile, Relaxed, Acquire, Release, AcqRel, SeqCst };
enum class Scope { Cta, Gpu, Sys };

namespace mem {
// The instructions of one (order, scope), specialised below; Q is its PTX qualifier string.
template <Order O, Scope S> struct Load;
template <Order O, Scope S> struct Store;
template <Order O, Scope S> struct Atomic;
template <Order O, Scope S> struct Fence;

#define SOLLAT_MEM_SCOPES(DEF, ORDER, Q) DEF(ORDER, Cta, Q ".cta") DEF(ORDER, Gpu, Q ".gpu") DEF(ORDER, Sys, Q ".sys")

#define SOLLAT_MEM_LOAD(ORDER, SCOPE, Q)                                                                    \
  template <> struct Load<Order::ORDER, Scope::SCOPE> {                                                     \
    __device__ __forceinline__ static u32 word(const u32* p) {                                              \
      u32 v;                                                                                                \
      asm volatile("ld" Q ".global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");                          \
      return v;                                                                                             \
    }                                                                                                       \
    __device__ __forceinline__ static u64 dword(const u64* p) {                                             \
      u64 v;                                                                                                \
      asm volatile("ld" Q ".global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");                          \
      return v;                                                                                             \
    }                                                                                                       \
    __device__ __forceinline__ static Line line(const Line* p) {                                            \
      Line l;                                                                                               \
      asm volatile("ld" Q ".global.v2.b64 {%0, %1}, [%2];" : "=l"(l.lo), "=l"(l.hi) : "l"(p) : "memory");  \
      return l;                                                                                             \
    }                                                                                                       \
  };
SOLLAT_MEM_LOAD(Volatile, Sys, ".volatile")
SOLLAT_MEM_SCOPES(SOLLAT_MEM_LOAD, Relaxed, ".relaxed")
SOLLAT_MEM_SCOPES(SOLLAT_MEM_LOAD, Acquire, ".acquire")

#define SOLLAT_MEM_STORE(ORDER, SCOPE, Q)                                                                   \
  template <> struct Store<Order::ORDER, Scope::SCOPE> {                                                    \
    __device__ __forceinline__ static void word(u32* p, u32 v) {                                            \
      asm volatile("st" Q ".global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");                             \
    }                                                                                                       \
    __device__ __forceinline__ static void dword(u64* p, u64 v) {                                           \
      asm volatile("st" Q ".global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");                             \
    }                                                                                                       \
    __device__ __forceinline__ static void line(Line* p, const Line& l) {                                   \
      asm volatile("st" Q ".global.v2.b64 [%0], {%1, %2};" ::"l"(p), "l"(l.lo), "l"(l.hi) : "memory");      \
    }                                                                                                       \
  };
SOLLAT_MEM_STORE(Volatile, Sys, ".volatile")
SOLLAT_MEM_SCOPES(SOLLAT_MEM_STORE, Relaxed, ".relaxed")
SOLLAT_MEM_SCOPES(SOLLAT_MEM_STORE, Release, ".release")

// Read-modify-writes: CAS, and the adds LL128 issues (16-byte vectors of f32, bf16x2 or f16x2,
// and single words; w holds the raw bits). Packed 16-bit adds keep denormals (.noftz).
#define SOLLAT_MEM_ATOMIC(ORDER, SCOPE, Q)                                                                  \
  template <> struct Atomic<Order::ORDER, Scope::SCOPE> {                                                   \
    __device__ __forceinline__ static u32 cas(u32* p, u32 expect, u32 value) {                              \
      u32 old;                                                                                              \
      asm volatile("atom" Q ".global.cas.b32 %0, [%1], %2, %3;" : "=r"(old) : "l"(p), "r"(expect), "r"(value) : "memory"); \
      return old;                                                                                           \
    }                                                                                                       \
    __device__ __forceinline__ static void add_v4(float*, void* p, const u32 (&w)[4]) {                     \
      asm volatile("red" Q ".global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(p), "f"(__uint_as_float(w[0])), \
                   "f"(__uint_as_float(w[1])), "f"(__uint_as_float(w[2])), "f"(__uint_as_float(w[3])) : "memory"); \
    }                                                                                                       \
    __device__ __forceinline__ static void add_v4(bf16*, void* p, const u32 (&w)[4]) {                      \
      asm volatile("red" Q ".global.add.noftz.v4.bf16x2 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(w[0]), "r"(w[1]), \
                   "r"(w[2]), "r"(w[3]) : "memory");                                                        \
    }                                                                                                       \
    __device__ __forceinline__ static void add_v4(f16*, void* p, const u32 (&w)[4]) {                       \
      asm volatile("red" Q ".global.add.noftz.v4.f16x2 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(w[0]), "r"(w[1]), \
                   "r"(w[2]), "r"(w[3]) : "memory");                                                        \
    }                                                                                                       \
    __device__ __forceinline__ static void add(float*, void* p, float v) {                                  \
      asm volatile("red" Q ".global.add.f32 [%0], %1;" ::"l"(p), "f"(v) : "memory");                         \
    }                                                                                                       \
    __device__ __forceinline__ static void add(bf16*, void* p, u32 w) {                                     \
      asm volatile("red" Q ".global.add.noftz.bf16x2 [%0], %1;" ::"l"(p), "r"(w) : "memory");                \
    }                                                                                                       \
    __device__ __forceinline__ static void add(f16*, void* p, u32 w) {                                      \
      asm volatile("red" Q ".global.add.noftz.f16x2 [%0], %1;" ::"l"(p), "r"(w) : "memory");                 \
    }                                                                                                       \
  };
SOLLAT_MEM_SCOPES(SOLLAT_MEM_ATOMIC, Relaxed, ".relaxed")
SOLLAT_MEM_SCOPES(SOLLAT_MEM_ATOMIC, Release, ".release")

#define SOLLAT_MEM_FENCE(ORDER, SCOPE, Q) \
  template <> struct Fence<Order::ORDER, Scope::SCOPE> { \
    __device__ __forceinline__ static void issue() { asm volatile("fence" Q ";" ::: "memory"); } \
  };
SOLLAT_MEM_SCOPES(SOLLAT_MEM_FENCE, AcqRel, ".acq_rel")
SOLLAT_MEM_SCOPES(SOLLAT_MEM_FENCE, SeqCst, ".sc")

#undef SOLLAT_MEM_FENCE
#undef SOLLAT_MEM_ATOMIC
#undef SOLLAT_MEM_STORE
#undef SOLLAT_MEM_LOAD
#undef SOLLAT_MEM_SCOPES
}  // namespace mem

template <Order O, Scope S> __device__ __forceinline__ u32 ld(const u32* p) { return mem::Load<O, S>::word(p); }
template <Order O, Scope S> __device__ __forceinline__ u64 ld(const u64* p) { return mem::Load<O, S>::dword(p); }
template <Order O, Scope S> __device__ __forceinline__ Line ld(const Line* p) { return mem::Load<O, S>::line(p); }
template <Order O, Scope S> __device__ __forceinline__ void st(u32* p, u32 v) { mem::Store<O, S>::word(p, v); }
template <Order O, Scope S> __device__ __forceinline__ void st(u64* p, u64 v) { mem::Store<O, S>::dword(p, v); }
template <Order O, Scope S> __device__ __forceinline__ void st(Line* p, const Line& l) { mem::Store<O, S>::line(p, l); }
template <Order O, Scope S> __device__ __forceinline__ u32 atom_cas(u32* p, u32 expect, u32 value) {
  return mem::Atomic<O, S>::cas(p, expect, value);
}
// One 16-byte vector atomic add of four words into p (16-byte aligned); T* selects the element type.
template <Order O, Scope S, typename T> __device__ __forceinline__ void red_add_v4(T* tag, void* p, const u32 (&w)[4]) {
  mem::Atomic<O, S>::add_v4(tag, p, w);
}
template <Order O, Scope S, typename T, typename V> __device__ __forceinline__ void red_add(T* tag, void* p, V v) {
  mem::Atomic<O, S>::add(tag, p, v);
}
// Orders this thread's memory operations before and after it (acq_rel by default) at scope S.
template <Scope S, Order O = Order::AcqRel> __device__ __forceinline__ void fence() { mem::Fence<O, S>::issue(); }

// Weak (plain) 16-byte accesses for data that is published by a release and read after the
// matching acquire (the bulk protocol, bulk_buffer.h): the flag's release/acquire and the
// block's barriers order them; they need no order of their own, so they stay weak (the fastest
// form). The "memory" clobber keeps the compiler from moving them across the flag accesses and
// barriers around them. ld_weak_l2 is served by L2 (`.cg`), where a peer's stores land, never from
// a line this SM's L1 kept from an earlier use of the same area.
__device__ __forceinline__ Line ld_weak_l2(const Line* p) {
  Line l;
  asm volatile("ld.global.cg.v2.b64 {%0, %1}, [%2];" : "=l"(l.lo), "=l"(l.hi) : "l"(p) : "memory");
  return l;
}
__device__ __forceinline__ void st_weak(Line* p, const Line& l) {
  asm volatile("st.global.v2.b64 [%0], {%1, %2};" ::"l"(p), "l"(l.lo), "l"(l.hi) : "memory");
}

// The scope of the peer that writes this GPU's scratch: another GPU on real ranks, this GPU on
// virtual ranks. What a thread did with a line it received (its reads, a sentinel reset, LL128's
// zeroing) is ordered before the store that lets the peer write that line again by
// fence<peer_scope()>() (LLBuffer issues it: ll_buffer.h): PTX's model asks for system scope when
// the observer runs on another GPU (a .gpu fence orders nothing for a thread there); gpu scope is
// the right one (135 ns on H200) when it runs on this GPU. SOLLAT_FENCE_SYS is set per build
// (sollat/collectives/algorithms.py).
#ifndef SOLLAT_FENCE_SYS
#define SOLLAT_FENCE_SYS 1
#endif
__host__ __device__ constexpr Scope peer_scope() { return SOLLAT_FENCE_SYS ? Scope::Sys : Scope::Gpu; }

// Raises a u32 flag in host-mapped (pinned) memory that the host polls without synchronising.
// `flag` holds its address (a pointer, or CommState::err_host's u64) and is read after the fence:
// __threadfence_system() (fence.sc.sys) publishes this thread's earlier writes first; the flag is
// a volatile store through the generic address (never cached, never elided).
template <typename Addr>
__device__ __forceinline__ void signal_host(const Addr& flag) {
  __threadfence_system();
  *(volatile u32*)flag = 1u;
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
