// sollat/collective.h - what every collective kernel shares: the communicator state, the kernel
// prologue (PDL, fault sink, buffer descriptors), and loading/storing user data as packs.
//
// Two entry points exist per kernel (see SOLLAT_DEFINE_ENTRY_POINTS):
//   *_pg  one rank per process (torch.distributed): grid.y == 1, rank from the argument.
//   *_vr  virtual ranks: R ranks in one launch, rank = rank_base + blockIdx.y, one input and one
//         output pointer per rank. Every block must be co-resident (the host checks occupancy),
//         because block b of rank r waits for block b of every other rank.
#ifndef SOLLAT_COLLECTIVE_H_
#define SOLLAT_COLLECTIVE_H_

#include "sollat/abi.h"  // CommState (each scratch starts with that rank's fault record), entry-point parameters
#include "sollat/layout.h"
#include "sollat/ll_buffer.h"

namespace sollat {

static_assert(kMaxWorld == 8, "ceil_div_ranks and pick_rank below are written for at most 8 ranks");

struct CallArgs {
  const CommState* st;
  u64 n;                   // elements per rank
  u64 region_off;          // byte offset of this kernel's buffer region(s) in every scratch
  u32* epochs;             // this launch-rank's epoch counters (already offset by blockIdx.y)
  int lines_per_src;
  u32 sig;
  int rank;
  int nranks;              // a kernel argument, not in CommState: loops and chunk offsets need it
                           // before the first load, and an argument costs no memory round trip
  u32* rec;                // this rank's fault record (a kernel argument for the same reason)
  u32 prior;               // its code when the kernel started: nonzero = refuse (see refused())
};

__device__ __forceinline__ FaultSink make_fault(const CallArgs& a) {
  FaultSink f;
  f.rec = a.rec;
  f.host = (u32*)a.st->err_host;
  f.timeout_ns = a.st->timeout_ns;
  f.peer_scratch = a.st->scratch;
  f.nranks = a.nranks;
  return f;
}

// Whether this call must not run because the communicator already holds a fault (this rank's or
// a peer's): the kernel then writes NaN into every output element it owns and sends nothing, so
// no line of a faulted sequence is ever accepted, and the host learns of it at its next check.
// Kernels call it after their first input loads and before their first send.
__device__ __forceinline__ bool refused(const CallArgs& a) {
  if (a.prior == 0u) return false;
  if (threadIdx.x == 0 && a.st->err_host) signal_host(a.st->err_host);
  return true;
}

// A pack of NaNs (every element the type's canonical quiet NaN): what a faulted call writes.
template <typename T, int Bytes>
__device__ __forceinline__ Pack<T, Bytes> nan_pack() {
  typedef typename Bits<T>::type B;
  Pack<T, Bytes> p;
#pragma unroll
  for (int k = 0; k < Pack<T, Bytes>::kElems; ++k) {
    const B b = Bits<T>::kCanonicalNaN;
    memcpy(&p.v[k], &b, sizeof(T));
  }
  return p;
}

// Descriptor of buffer number `which` (regions are laid back to back, each `region_bytes` long,
// starting at region_off; epochs likewise, lines_per_src counters per buffer).
template <int kMaxRanks>
__device__ __forceinline__ BufferDesc<kMaxRanks> make_desc(const CallArgs& a, int which, u64 region_bytes) {
  BufferDesc<kMaxRanks> d;
#pragma unroll
  for (int q = 0; q < kMaxRanks; ++q)
    d.base[q] = (Line*)(a.st->scratch[q] + a.region_off + (u64)which * region_bytes);
  d.epochs = a.epochs + (u64)which * (u64)a.lines_per_src;
  d.rank = a.rank;
  d.nranks = a.nranks;
  d.lines_per_src = a.lines_per_src;
  d.sig = a.sig;
  return d;
}

// ---- user data <-> packs ----------------------------------------------------------------------
// Element e0 .. e0+kElems-1 of `p`. Vector access when the line is whole and aligned; element
// access (zero padding past n) for the tail and for misaligned views.
template <typename T, int Bytes>
__device__ __forceinline__ Pack<T, Bytes> load_pack(const T* p, u64 e0, u64 n, bool aligned) {
  typedef Pack<T, Bytes> P;
  P v;
  if (aligned && e0 + P::kElems <= n) {
    v = *reinterpret_cast<const P*>(p + e0);
  } else {
#pragma unroll
    for (int k = 0; k < P::kElems; ++k) {
      if (e0 + k < n) v.v[k] = p[e0 + k];
      else memset(&v.v[k], 0, sizeof(T));
    }
  }
  return v;
}

template <typename T, int Bytes>
__device__ __forceinline__ void store_pack(T* p, u64 e0, u64 n, bool aligned, const Pack<T, Bytes>& v) {
  typedef Pack<T, Bytes> P;
  if (aligned && e0 + P::kElems <= n) {
    *reinterpret_cast<P*>(p + e0) = v;
  } else {
#pragma unroll
    for (int k = 0; k < P::kElems; ++k)
      if (e0 + k < n) p[e0 + k] = v.v[k];
  }
}

// ceil(n / r) for r = 1..kMaxWorld. Each case divides by a constant (multiply and shift): a
// division by a run-time 64-bit value is a called subroutine, which costs time and registers.
__device__ __forceinline__ u64 ceil_div_ranks(u64 n, int r) {
  switch (r) {
    case 1: return n;
    case 2: return (n + 1) / 2;
    case 3: return (n + 2) / 3;
    case 4: return (n + 3) / 4;
    case 5: return (n + 4) / 5;
    case 6: return (n + 5) / 6;
    case 7: return (n + 6) / 7;
    default: return (n + 7) / 8;
  }
}

__device__ __forceinline__ bool is_aligned(const void* p, int bytes) {
  return ((unsigned long long)p & (unsigned long long)(bytes - 1)) == 0;
}

// Argument k of eight (k = blockIdx.y < kMaxRanks for virtual ranks) as a select tree on the bits
// of k, only as deep as kMaxRanks needs (one select for 2 ranks, three for 8). No branches, no
// indexed access (which would copy the parameters to local memory), and no long chain of
// predicated parameter loads into one register (each waits for the previous: a chain of seven
// measured about 0.15 us at the start of every virtual-rank kernel).
template <int kMaxRanks, typename P>
__device__ __forceinline__ P pick_rank(int k, P a0, P a1, P a2, P a3, P a4, P a5, P a6, P a7) {
  static_assert(kMaxRanks == 2 || kMaxRanks == 4 || kMaxRanks == 8, "2, 4 or 8 ranks");
  const bool b0 = k & 1, b1 = k & 2, b2 = k & 4;
  const P p01 = b0 ? a1 : a0;
  if (kMaxRanks == 2) return p01;
  const P p23 = b0 ? a3 : a2, p03 = b1 ? p23 : p01;
  if (kMaxRanks == 4) return p03;
  const P p45 = b0 ? a5 : a4, p67 = b0 ? a7 : a6, p47 = b1 ? p67 : p45;
  return b2 ? p47 : p03;
}

// Kernel prologue shared by every entry point, in this order:
//   1. let the next kernel launch (PDL);
//   2. one thread asks L2 for the communicator state and for the first line of each of the call's
//      pointers (`lines`: input, output, epochs, fault record ...);
//   3. wait for the previous kernel.
// A prefetch returns no data, so nothing a previous kernel may still be writing is read before
// the wait: every read of those lines comes after it, served by L2, which is coherent. What step 2
// buys is that the kernel-parameter lines (a prefetch needs its address) and these memory lines
// are fetched while the previous kernel finishes instead of after it: 0.10 - 0.17 us per 128 B
// call, never slower at any size measured (virtual ranks, docs/benchmarks.md run 21). Copying
// CommState into registers here as well measured slower for the two-shot (longer live ranges, a
// stack frame), so it is read after the wait where it is used. With SOLLAT_TEST_HOOKS (test
// builds only, so production kernels pay no extra load) the blocks of `absent_rank` return at
// once, which is how the tests make a peer that never arrives.
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

template <typename... Ptrs>
__device__ __forceinline__ bool prologue(const CommState* st, int rank, const Ptrs*... lines) {
  pdl_launch_dependents();
  if (threadIdx.x == 0) {  // one thread: the lines and the parameters are the whole block's
    (prefetch_l2(lines), ...);
    prefetch_l2(st);
  }
  pdl_wait();
#ifdef SOLLAT_TEST_HOOKS
  if (st->absent_rank == rank) return false;
#endif
  return true;
}

__device__ __forceinline__ u32 call_signature(const CommState* st, u32 sig, int rank) {
#ifdef SOLLAT_TEST_HOOKS
  if (st->mismatch_rank == rank) return sig ^ 2u;
#endif
  return sig;
}

}  // namespace sollat

// Defines <name>_pg and <name>_vr entry points around BODY(const CallArgs&, const T* in, T* out).
// `rec` is the fault record of launch rank 0 (this rank's, for _pg); launch rank y's is
// `rank_stride` bytes further (virtual ranks' scratches are laid back to back). Its code is loaded
// right after the wait, so the load travels together with the input and descriptor loads (relaxed:
// a nonzero code only makes the kernel refuse; no detail word is read). The parameter lists
// are sollat/abi.py's PG_PARAMS and VR_PARAMS (abi.h), which the host packs in the same order.
#define SOLLAT_DEFINE_ENTRY_POINTS(name, T, BODY)                                                          \
  extern "C" __global__ void __launch_bounds__(SOLLAT_MAX_THREADS, 1) name##_pg(SOLLAT_PG_PARAMS) {       \
    if (!sollat::prologue(st, rank, in, out, epochs, rec)) return;                                         \
    const sollat::u32 prior = sollat::ld<sollat::Order::Relaxed, sollat::Scope::Sys>(rec);                 \
    sollat::CallArgs a{st, n, region_off, epochs, lines_per_src, sollat::call_signature(st, sig, rank),   \
                       rank, nranks, rec, prior};                                                          \
    BODY(a, (const T*)in, (T*)out);                                                                        \
  }                                                                                                        \
  extern "C" __global__ void __launch_bounds__(SOLLAT_MAX_THREADS, 1) name##_vr(SOLLAT_VR_PARAMS) {       \
    const int y = blockIdx.y;                                                                              \
    const int rank = rank_base + y;                                                                        \
    const void* in = sollat::pick_rank<SOLLAT_MAX_RANKS>(y, i0, i1, i2, i3, i4, i5, i6, i7);               \
    void* out = sollat::pick_rank<SOLLAT_MAX_RANKS>(y, o0, o1, o2, o3, o4, o5, o6, o7);                    \
    sollat::u32* rank_epochs = epochs + (sollat::u64)y * (sollat::u64)lines_per_src * kBuffers;            \
    sollat::u32* rec = (sollat::u32*)((char*)rec0 + (sollat::u64)y * rank_stride);                         \
    if (!sollat::prologue(st, rank, in, out, rank_epochs, rec)) return;                                    \
    const sollat::u32 prior = sollat::ld<sollat::Order::Relaxed, sollat::Scope::Sys>(rec);                 \
    sollat::CallArgs a{st, n, region_off, rank_epochs, lines_per_src, sollat::call_signature(st, sig, rank), \
                       rank, nranks, rec, prior};                                                          \
    BODY(a, (const T*)in, (T*)out);                                                                        \
  }

#endif  // SOLLAT_COLLECTIVE_H_
