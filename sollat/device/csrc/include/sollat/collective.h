// sollat/collective.h - what every collective kernel shares: the communicator state, the kernel
// prologue (PDL, fault sink, buffer descriptors), and loading/storing user data as packs.
//
// One entry point per kernel serves both communicators (SOLLAT_DEFINE_ENTRY_POINTS): launch rank
// y = blockIdx.y is rank rank_base + y and finds its tensors in the rank table (RankTable below).
// A Communicator (one rank per process, torch.distributed) builds with SOLLAT_TABLE_RANKS=1 and
// launches grid.y == 1 (y is then the constant 0); a VirtualCommunicator (R ranks in one launch)
// builds with SOLLAT_TABLE_RANKS = the kernel's rank cap. Every block must be co-resident (the host
// checks occupancy), because block b of rank r waits for block b of every other rank.
#ifndef SOLLAT_COLLECTIVE_H_
#define SOLLAT_COLLECTIVE_H_

#include "sollat/abi.h"  // CommState (each scratch starts with that rank's fault record), entry-point parameters
#include "sollat/layout.h"
#include "sollat/ll_buffer.h"

namespace sollat {

#ifndef SOLLAT_TABLE_RANKS
#define SOLLAT_TABLE_RANKS 1
#endif
constexpr int kTableRanks = SOLLAT_TABLE_RANKS;
static_assert(kTableRanks >= 1 && kTableRanks <= kMaxWorld, "SOLLAT_TABLE_RANKS: 1..kMaxWorld");

// The call's tensor pointers (abi.py POINTER_LISTS): list l of launch rank y at p[l * kTableRanks
// + y]. A __grid_constant__ kernel parameter: read in place from the constant bank, so a run-time
// y costs one indexed load (no copy to local memory, no select chain over the ranks).
template <int kLists>
struct RankTable {
  u64 p[kLists * kTableRanks];
  __device__ __forceinline__ u64 at(int list, int y) const { return p[list * kTableRanks + y]; }
};
// The launch rank of this block: blockIdx.y, or the constant 0 in a one-rank build.
__device__ __forceinline__ int launch_rank() { return kTableRanks == 1 ? 0 : (int)blockIdx.y; }

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
// Up to kPeerWindow ranks the bases are loaded here, into registers; a wide group keeps
// CommState's table and the offset instead (BufferDesc, ll_buffer__types.h). CommState holds
// kMaxWorld entries (zero past the world), written by the host before any kernel, so every held
// base is a plain load.
template <int kMaxRanks>
__device__ __forceinline__ BufferDesc<kMaxRanks> make_desc(const CallArgs& a, int which, u64 region_bytes) {
  BufferDesc<kMaxRanks> d;
  const u64 off = a.region_off + (u64)which * region_bytes;
  if constexpr (BufferDesc<kMaxRanks>::kWide) {
    d.scratch = a.st->scratch;
    d.off = off;
  }
  if constexpr (BufferDesc<kMaxRanks>::kHeld) {
#pragma unroll
    for (int q = 0; q < kMaxRanks; ++q) d.base[q] = (Line*)(a.st->scratch[q] + off);
  }
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

// ceil(n / r) for r = 1..kMaxRanks. Up to 8 ranks each case divides by a constant (multiply and
// shift): a division by a run-time 64-bit value is a called subroutine, which costs time and
// registers. Wider groups divide at run time, in 32 bits where n fits.
template <int kMaxRanks>
__device__ __forceinline__ u64 ceil_div_ranks(u64 n, int r) {
  if constexpr (kMaxRanks > 8) {
    if (n < 0xFFFFFFFFull - (u64)r) return (u64)(((u32)n + (u32)r - 1u) / (u32)r);
    return (n + (u64)r - 1) / (u64)r;
  }
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

// Kernel prologue shared by every entry point, in this order:
//   1. let the next kernel launch (PDL);
//   2. one thread asks L2 for the communicator state and for the first line of each of the call's
//      pointers (`lines`: input, output, epochs, fault record ...);
//   3. wait for the previous kernel.
// A prefetch returns no data, so nothing a previous kernel may still be writing is read before
// the wait: every read of those lines comes after it, served by L2, which is coherent. What step 2
// buys is that the kernel-parameter lines (a prefetch needs its address) and these memory lines
// are fetched while the previous kernel finishes instead of after it: 0.10 - 0.17 us per 128 B
// call, never slower at any size measured (virtual ranks, docs/benchmarks.md, the kernel prologue). Copying
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

// Defines the entry point `name` around BODY(const CallArgs&, const T* in, T* out): launch rank
// y's rank, tensors, epoch counters and fault record (launch rank 0's is `rec0`, launch rank y's
// `rank_stride` bytes further: virtual ranks' scratches are laid back to back). The record's code
// is loaded right after the wait, so the load travels together with the input and descriptor loads
// (relaxed: a nonzero code only makes the kernel refuse; no detail word is read), and lane 0's
// value is every lane's: the lanes of a warp refuse together (LL128 and the fused RMSNorm's
// butterflies sync all 32 lanes, which must all be running). Every lane is here: blocks are whole
// warps. The parameter list is sollat/device/abi.py's (abi.h SOLLAT_PARAMS), which the host packs
// in the same order. __launch_bounds__: the kernel's threads per block (abi.py KERNELS; the module
// define SOLLAT_BLOCK_THREADS where they are fewer than SOLLAT_MAX_THREADS), which bounds ptxas's
// registers per thread (65536 / threads, at most 255).
#ifndef SOLLAT_BLOCK_THREADS
#define SOLLAT_BLOCK_THREADS SOLLAT_MAX_THREADS
#endif
#define SOLLAT_DEFINE_ENTRY_POINTS(name, T, BODY)                                                          \
  extern "C" __global__ void __launch_bounds__(SOLLAT_BLOCK_THREADS, 1) name(SOLLAT_PARAMS) {             \
    const int y = sollat::launch_rank();                                                                   \
    const int rank = rank_base + y;                                                                        \
    const void* in = (const void*)ptrs.at(sollat::kListIn, y);                                             \
    void* out = (void*)ptrs.at(sollat::kListOut, y);                                                       \
    sollat::u32* rank_epochs = epochs + (sollat::u64)y * (sollat::u64)lines_per_src * kBuffers;            \
    sollat::u32* rec = (sollat::u32*)((char*)rec0 + (sollat::u64)y * rank_stride);                         \
    if (!sollat::prologue(st, rank, in, out, rank_epochs, rec)) return;                                    \
    const sollat::u32 prior = __shfl_sync(0xFFFFFFFFu, sollat::ld<sollat::Order::Relaxed, sollat::Scope::Sys>(rec), 0); \
    sollat::CallArgs a{st, n, region_off, rank_epochs, lines_per_src, sollat::call_signature(st, sig, rank), \
                       rank, nranks, rec, prior};                                                          \
    BODY(a, (const T*)in, (T*)out);                                                                        \
  }

#endif  // SOLLAT_COLLECTIVE_H_
