// Fused AllReduce + residual add + RMSNorm, one-shot LL, ONE BLOCK PER ROW (algorithm
// rmsnorm_oneshot_ll_block, public name oneshot_ll_block), written with the LLBuffer device API.
//
// The arithmetic is kernels/allreduce_rmsnorm.cu's, bit for bit (sollat/rmsnorm_math.h;
// rmsnorm.reference replays it): per row, the rank-order fp32 sum rounded to T, the residual added
// and rounded (r, stored into res_out), the pairwise tree over float(r_e)^2 zero-padded to a power
// of two, rstd = 1 / sqrt(ss / hidden + eps) (div.rn, sqrt.rn), y = round_T((r * rstd) * w), and
// with SOLLAT_RMSNORM_FP8=1 the e4m3 copy of the stored y. Only the cut differs: a row belongs to
// one block (rmsnorm.block_row_geometry), so the row's sum of squares needs no cluster exchange:
//   * line ((p * kSlots + s) * blockDim.x + threadIdx.x) of a row is pass p, slot s of the thread
//     (blockDim.x a multiple of 32, at most abi.MAX_THREADS; block b takes rows b, b + gridDim.x, ...);
//   * per line: square_tree; per warp, slot and pass: warp_tree_sums over its 32 consecutive lines,
//     i.e. chunk ((p * kSlots + s) * blockDim.x) / 32 + warp, an aligned subtree, whose sum lane 0
//     stores into the block's shared chunk_sums[row parity][chunk];
//   * the row's __syncthreads_or (which also tells every thread whether any thread met a fault)
//     makes those stores visible, and every warp computes row_tree_sum over the row's chunks: the
//     row's whole tree, the same bits in every warp.
// Parity reuse: chunk_sums[parity] is written again two rows on, after the next row's
// __syncthreads_or, which every thread reaches only after its reads of this row's sums.
//
// The exchange is the one-shot AllReduce's (kernels/allreduce_oneshot.cu): each thread bcasts its
// lines of the pass and receives every peer's by recvReduce, which sums in rank order. A thread's
// kSlots lines are kGroups LLBuffers of kGroupSlots channels each (channels slot_index(block,
// g * kGroupSlots + i, thread): disjoint, so each buffer's epochs and credit are its own, exactly
// as one buffer's): every group's lines are sent first, then the groups are received one after the
// other, so the later groups' lines travel while the first is reduced, and a poll set holds
// kGroupSlots lines per peer (registers: 8 ranks x 4 lines of 16 bytes would be the whole budget
// of a 512-thread block). LL only: its lines carry the call signature and epoch in their flags, so
// each group's receive checks the call on its own; a sentinel buffer's signature word is one per
// (block, thread) and would be shared by the groups (ll_buffer.h, "Signature words").
// Fences: between a pass's receives and the next pass's sends, one fence for both groups
// (releaseReceivesWith); each group's channels are only ever used through its own buffer, so
// ll_buffer.h's credit argument holds per group.
//
// Faults: a refused call, a receive that gives up (timeout, call mismatch, a peer's fault) make
// the thread send and receive nothing more (no early exit: it still joins its warp's butterflies
// and the block's barrier); the row's __syncthreads_or tells every thread of the block, and then
// each writes NaN into its lines of every output from that row on and nobody commits epochs.
//
// Pipelined passes (module define SOLLAT_RMSNORM_BLOCK_PIPE=1, algorithm
// rmsnorm_oneshot_ll_block_pipe; one receive group): see at the buffers below.
//
// Module defines (sollat/collectives/algorithms.py): SOLLAT_T (float, sollat::bf16, sollat::f16),
// SOLLAT_PROTO (ProtoLL), SOLLAT_MAX_RANKS (2, 4, 8, 72), SOLLAT_SLOTS (lines per thread per pass:
// 1, 2, 4), SOLLAT_RMSNORM_BLOCK_THREADS (its __launch_bounds__: algorithms.rmsnorm_block_threads),
// SOLLAT_RMSNORM_FP8 (0 or absent, 1), SOLLAT_RMSNORM_BLOCK_PIPE (0 or absent, 1); SOLLAT_OP is
// OpSum and not used.
// Kernels: ar_rmsnorm_block (abi.h SOLLAT_RMSNORM_PARAMS), with SOLLAT_RMSNORM_FP8 instead
// ar_rmsnorm_block_fp8 (SOLLAT_RMSNORM_FP8_PARAMS) (abi.rmsnorm_entry).
#include "sollat/collective.h"
#include "sollat/rmsnorm_math.h"

#ifndef SOLLAT_RMSNORM_FP8
#define SOLLAT_RMSNORM_FP8 0
#endif
#ifndef SOLLAT_RMSNORM_BLOCK_PIPE
#define SOLLAT_RMSNORM_BLOCK_PIPE 0
#endif

using namespace sollat;
#ifndef SOLLAT_RMSNORM_BLOCK_THREADS
#define SOLLAT_RMSNORM_BLOCK_THREADS 256
#endif

constexpr int kBuffers = kArRmsnormBlockBuffers;  // abi.h (sollat/device/abi.py KERNELS)

namespace {

// Channels per receive group: every line of the thread where the rank cap is small, two at 8
// ranks, one in a wide group (whose own windows hold the registers).
template <int kMaxRanks, int kSlots> struct GroupSlots {
  static constexpr int value = kMaxRanks <= 4 ? kSlots : kMaxRanks <= kPeerWindow ? (kSlots < 2 ? kSlots : 2) : 1;
};

// The second group's stand-in where there is one group: no code.
struct NoGroup {
  template <class... Args> __device__ __forceinline__ explicit NoGroup(const Args&...) {}
  template <typename T, class V> __device__ __forceinline__ V bcast(int, const V& v) { return v; }
  template <typename T, class Op, class... Args> __device__ __forceinline__ bool recvReduce(const Args&...) {
    return false;
  }
  __device__ __forceinline__ bool owesFence() const { return false; }
  __device__ __forceinline__ void fenced() {}
  __device__ __forceinline__ void advanceEpoch() {}
  __device__ __forceinline__ void commit() {}
};
template <bool kOn, class B> struct GroupBuffer { typedef NoGroup type; };
template <class B> struct GroupBuffer<true, B> { typedef B type; };

}  // namespace

template <typename T, class Proto, int kMaxRanks, int kSlots, bool kFp8, bool kPipe>
__device__ __forceinline__ void ar_rmsnorm_block(const CallArgs& a, u64 hidden, float eps, const T* in, T* out,
                                                 const T* res, T* res_out, const T* weight, Fp8Out fp8) {
  constexpr int kG = GroupSlots<kMaxRanks, kSlots>::value;
  constexpr int kGroups = kSlots / kG;
  static_assert(kGroups * kG == kSlots && kGroups <= 2, "one or two receive groups");
  static_assert(!kPipe || kGroups == 1, "the pipelined passes take one receive group");
  typedef LLBuffer<Proto, kMaxRanks, kG> Buf;
  typedef typename GroupBuffer<(kGroups > 1 || kPipe), Buf>::type Buf1;
  typedef typename Buf::template PackT<T> P;
  typedef typename Buf::template AccT<T> A;
  constexpr int kElems = P::kElems;
  constexpr int kBytes = (int)sizeof(P);
  constexpr int kChunks = RmsnormChunks<T, kBytes>::value;  // chunks of a row of rmsnorm.MAX_HIDDEN
  static_assert(kChunks <= kRmsnormMaxChunks && kChunks % 4 == 0, "row_tree_sum covers the row, rows 16-byte aligned");
  __shared__ __align__(16) u32 chunk_sums[2][kChunks];  // by row parity: [c] chunk c's sum (float bits)

  const u64 rows = a.n / hidden;
  const int threads = (int)blockDim.x;
  const int row_lines = (int)((hidden + kElems - 1) / kElems);
  const int n_chunks = (row_lines + kWarpSize - 1) / kWarpSize;
  const int passes = (row_lines + threads * kSlots - 1) / (threads * kSlots);  // as rmsnorm.block_row_geometry
  const int lane = (int)threadIdx.x & (kWarpSize - 1);
  const int warp = (int)threadIdx.x / kWarpSize;
  auto line_of = [&](int p, int s) { return (p * kSlots + s) * threads + (int)threadIdx.x; };
  // The chunk of this warp's lines of slot s in pass p (the same in every lane).
  auto chunk_of = [&](int p, int s) { return ((p * kSlots + s) * threads) / kWarpSize + warp; };
  auto active_in = [&](int p) {  // lines of pass p this thread holds: a prefix of its slots
    int n = 0;
#pragma unroll
    for (int s = 0; s < kSlots; ++s)
      if (line_of(p, s) < row_lines) n = s + 1;
    return n;
  };
  auto load_row = [&](const T* base, u64 row, int line) {
    const T* r = base + row * hidden;
    return load_pack<T, kBytes>(r, (u64)line * kElems, hidden, is_aligned(r, kBytes));
  };
  // Whole rows (hidden a multiple of a line, every tensor line-aligned) load without a branch (a
  // slot past the row's end loads line 0 again: in bounds, never used), so the slots' loads are
  // in flight together (kernels/allreduce_rmsnorm.cu, load_slots).
  const bool whole = hidden % (u64)kElems == 0 && is_aligned(in, kBytes) && is_aligned(res, kBytes) &&
                     is_aligned(weight, kBytes);
  auto load_slots = [&](const T* base, u64 row, int p, int active, P (&v)[kSlots]) {
    if (whole) {
#pragma unroll
      for (int s = 0; s < kSlots; ++s) {
        const int line = line_of(p, s);
        v[s] = *reinterpret_cast<const P*>(base + row * hidden + (u64)(line < row_lines ? line : 0) * kElems);
      }
    } else {
#pragma unroll
      for (int s = 0; s < kSlots; ++s)
        if (s < active) v[s] = load_row(base, row, line_of(p, s));
    }
  };
  auto store_row = [&](T* base, u64 row, int line, const P& v) {
    T* r = base + row * hidden;
    store_pack<T, kBytes>(r, (u64)line * kElems, hidden, is_aligned(r, kBytes), v);
  };
  auto store_q = [&](u64 row, int line, u64 word) {
    store_fp8<kElems>(fp8.q + row * hidden, (u64)line * kElems, hidden, word);
  };
  // A faulted or refused call: NaN into this thread's lines of every output from row `first` on.
  auto poison_from = [&](u64 first) {
    const P nan = nan_pack<T, kBytes>();
    for (u64 row = first; row < rows; row += gridDim.x)
      for (int p = 0; p < passes; ++p)
#pragma unroll
        for (int s = 0; s < kSlots; ++s) {
          const int line = line_of(p, s);
          if (line < row_lines) {
            store_row(out, row, line, nan);
            store_row(res_out, row, line, nan);
            if constexpr (kFp8) store_q(row, line, 0x0101010101010101ull * (u64)kFp8E4M3NaN);
          }
        }
  };

  // The first input loads go out before the buffers are set up (as in the one-shot AllReduce).
  const u64 first_row = blockIdx.x;
  P own[kSlots];
  int active = active_in(0);
  load_slots(in, first_row, 0, active, own);
  // A refusing thread runs the first row as a faulted one (nothing sent): the row's barrier tells
  // the block, which writes NaN from there (no thread leaves before a barrier the others wait at).
  const bool refuses = refused(a);
  const FaultSink fault = make_fault(a);
  const BufferDesc<kMaxRanks> desc = make_desc<kMaxRanks>(a, 0, region_bytes(a.nranks, a.lines_per_src));
  // Pipelined passes (kPipe, rows of several passes): pass p of a row runs on buffer p & 1, buf1
  // on the channels of block blockIdx.x + gridDim.x of the region (its blocks: lines_per_src /
  // (kMaxSlotsPerThread * kMaxThreads); the host leaves room: rmsnorm.block_row_geometry), and
  // pass p + 1's lines are sent before pass p's are received. Every rank decides alike (the same
  // launch, the same region). Without room the passes run one after the other on buf0.
  const int region_blocks = a.lines_per_src / (kMaxSlotsPerThread * kMaxThreads);
  const bool pipe = kPipe && passes > 1 && 2 * (int)gridDim.x <= region_blocks;
  Buf buf0(desc, fault, slot_index(blockIdx.x, 0, threadIdx.x));
  // (kPipe without room: buf1 reads buf0's epochs and is neither used nor committed)
  Buf1 buf1(desc, fault, kPipe ? slot_index(blockIdx.x + (pipe ? gridDim.x : 0), 0, threadIdx.x)
                               : slot_index(blockIdx.x, kG, threadIdx.x));
  float scale = 0.0f;  // on the device at every launch (a graph replay sees its current value)
  if constexpr (kFp8) scale = *fp8.scale;

  int parity = 0;
  for (u64 row = first_row; row < rows; row += gridDim.x, parity ^= 1) {
    bool ok = !refuses;
    P kept[kSlots];  // the last pass's r and weight stay in registers for the normalisation
    P wt[kSlots];
    for (int p = 0; p < passes; ++p) {
      float part[kSlots];  // square_tree of each slot's line (0: no line, or after a fault)
#pragma unroll
      for (int s = 0; s < kSlots; ++s) part[s] = 0.0f;
      // (pipelined: a later pass's lines were loaded and sent during the previous pass)
      if (ok && (p > 0 || row != first_row) && !(pipe && p > 0)) {
        active = active_in(p);
        load_slots(in, row, p, active, own);
      }
      const bool odd = pipe && (p & 1) != 0;  // this pass runs on buf1
      int next_active = 0;
      P next[kSlots];
      if (ok && active > 0) {
        // The residual (and, in the last pass, the weight) loads go out before the sends.
        P r_in[kSlots];
        load_slots(res, row, p, active, r_in);
        if (p == passes - 1) load_slots(weight, 0, p, active, wt);
        if (!pipe || p == 0) {
          // One fence for both buffers' receives so far (none in a call's first pass).
          buf0.releaseReceivesWith(buf1);
          // Every group's lines first, as the peers receive them (every rank reduces the same bits).
#pragma unroll
          for (int s = 0; s < kSlots; ++s) {
            if (s >= active) continue;
            if (s < kG) own[s] = buf0.template bcast<T>(s, own[s]);
            else own[s] = buf1.template bcast<T>(s - kG, own[s]);
          }
        }
        if (pipe && p + 1 < passes) {
          // Pass p + 1's lines, on the other buffer, before this pass's receive. That buffer's
          // send fences its own receives of pass p - 1 first (beforeSend): its credit is its own.
          next_active = active_in(p + 1);
          load_slots(in, row, p + 1, next_active, next);
#pragma unroll
          for (int s = 0; s < kSlots; ++s) {
            if (s >= next_active) continue;
            if (odd) next[s] = buf0.template bcast<T>(s, next[s]);
            else next[s] = buf1.template bcast<T>(s, next[s]);
          }
        }
        // r of line s, as every rank has it: into res_out and the line's squares.
        auto take = [&](int s, const A& acc) {
          P r;
#pragma unroll
          for (int e = 0; e < kElems; ++e) r.v[e] = residual_add<T>(acc.v[e], r_in[s].v[e]);
          store_row(res_out, row, line_of(p, s), r);
          part[s] = square_tree(r);  // past the row's end: +0 elements, +0 squares
          kept[s] = r;
        };
        {
          P mine[kG];
          A acc[kG];
#pragma unroll
          for (int i = 0; i < kG; ++i) mine[i] = own[i];
          const int n0 = active < kG ? active : kG;
          const bool got = odd ? buf1.template recvReduce<T, OpSum>(n0, mine, acc)
                               : buf0.template recvReduce<T, OpSum>(n0, mine, acc);
          if (got) {
#pragma unroll
            for (int i = 0; i < kG; ++i)
              if (i < n0) take(i, acc[i]);
            if (odd) buf1.advanceEpoch();
            else buf0.advanceEpoch();
          } else {
            ok = false;  // fault recorded; the second group is not polled
          }
        }
        if constexpr (kGroups > 1) {
          const int n1 = active - kG;
          if (ok && n1 > 0) {
            P mine[kG];
            A acc[kG];
#pragma unroll
            for (int i = 0; i < kG; ++i) mine[i] = own[kG + i];
            if (buf1.template recvReduce<T, OpSum>(n1, mine, acc)) {
#pragma unroll
              for (int i = 0; i < kG; ++i)
                if (i < n1) take(kG + i, acc[i]);
              buf1.advanceEpoch();
            } else {
              ok = false;  // fault recorded
            }
          }
        }
      }
      if (pipe && p + 1 < passes) {  // the next pass's lines, already sent
        active = next_active;
#pragma unroll
        for (int s = 0; s < kSlots; ++s) own[s] = next[s];
      }
      // The chunks of this pass, every slot's butterfly interleaved (every lane: the pass loop is
      // block-uniform); a slot past the row's last chunk sums zeros and is not stored.
      warp_tree_sums(part);
      if (lane == 0) {
#pragma unroll
        for (int s = 0; s < kSlots; ++s) {
          const int c = chunk_of(p, s);
          if (c < n_chunks) chunk_sums[parity][c] = __float_as_uint(part[s]);
        }
      }
    }

    // Whether any thread of the block met a fault; the barrier also makes the chunk sums visible.
    if (__syncthreads_or(!ok)) return poison_from(row);
    const float total = row_tree_sum(chunk_sums[parity], n_chunks);
    const float rstd = div_rn(1.0f, sqrt_rn(add_rn(div_rn(total, (float)hidden), eps)));

    for (int p = 0; p < passes; ++p) {
      const bool last = p == passes - 1;
#pragma unroll
      for (int s = 0; s < kSlots; ++s) {
        const int line = line_of(p, s);
        if (line >= row_lines) continue;
        // Earlier passes read back what this thread stored into res_out (same thread, same
        // address: program order), the last one is still in registers.
        const P r = last ? kept[s] : load_row(res_out, row, line);
        const P w = last ? wt[s] : load_row(weight, 0, line);
        P y;
#pragma unroll
        for (int e = 0; e < kElems; ++e) y.v[e] = from_acc<T>(mul_rn(mul_rn(to_acc(r.v[e]), rstd), to_acc(w.v[e])));
        store_row(out, row, line, y);
        if constexpr (kFp8) store_q(row, line, e4m3_word(y, scale));  // the stored (rounded) y / scale, to e4m3
      }
    }
  }
  buf0.commit();
  if (kGroups > 1 || pipe) buf1.commit();
}

__device__ __forceinline__ void ar_rmsnorm_block_body(const CallArgs& a, u64 hidden, u32 eps_bits, const void* in,
                                                      void* out, const void* res, void* res_out, const void* weight,
                                                      Fp8Out fp8 = Fp8Out{nullptr, nullptr}) {
  typedef SOLLAT_T T;
  ar_rmsnorm_block<T, SOLLAT_PROTO, SOLLAT_MAX_RANKS, SOLLAT_SLOTS, SOLLAT_RMSNORM_FP8 != 0,
                   SOLLAT_RMSNORM_BLOCK_PIPE != 0>(
      a, hidden, bit_cast<float>(eps_bits), (const T*)in, (T*)out, (const T*)res, (T*)res_out, (const T*)weight, fp8);
}

// Entry points: kernels/allreduce_rmsnorm.cu's (the same parameters and rank table), one block
// of up to abi.MAX_THREADS threads per row.
#define SOLLAT_RMSNORM_BLOCK_BODY(...)                                                                        \
  const int y = sollat::launch_rank();                                                                        \
  const int rank = rank_base + y;                                                                             \
  const void* in = (const void*)ptrs.at(sollat::kListIn, y);                                                  \
  void* out = (void*)ptrs.at(sollat::kListOut, y);                                                            \
  const void* res = (const void*)ptrs.at(sollat::kListRes, y);                                                \
  void* res_out = (void*)ptrs.at(sollat::kListResOut, y);                                                     \
  const void* weight = (const void*)ptrs.at(sollat::kListWeight, y);                                          \
  sollat::u32* rank_epochs = epochs + (sollat::u64)y * (sollat::u64)lines_per_src * kBuffers;                 \
  sollat::u32* rec = (sollat::u32*)((char*)rec0 + (sollat::u64)y * rank_stride);                              \
  if (!sollat::prologue(st, rank, in, out, res, weight, rank_epochs, rec)) return;                            \
  const sollat::u32 prior = __shfl_sync(0xFFFFFFFFu, sollat::ld<sollat::Order::Relaxed, sollat::Scope::Sys>(rec), 0); \
  sollat::CallArgs a{st, n, region_off, rank_epochs, lines_per_src, sollat::call_signature(st, sig, rank),     \
                     rank, nranks, rec, prior};                                                               \
  ar_rmsnorm_block_body(a, hidden, eps_bits, in, out, res, res_out, weight __VA_ARGS__);

// Entry-point names (abi.rmsnorm_entry): ar_rmsnorm_block[_fp8].
#define SOLLAT_RMSNORM_ENTRY ar_rmsnorm_block
#define SOLLAT_RMSNORM_FP8_ENTRY ar_rmsnorm_block_fp8

#if SOLLAT_RMSNORM_FP8
extern "C" __global__ void __launch_bounds__(SOLLAT_RMSNORM_BLOCK_THREADS, 1)
SOLLAT_RMSNORM_FP8_ENTRY(SOLLAT_RMSNORM_FP8_PARAMS) {
  SOLLAT_RMSNORM_BLOCK_BODY(, Fp8Out{(unsigned char*)ptrs.at(sollat::kListFp8Out, y),
                                     (const float*)ptrs.at(sollat::kListFp8Scale, y)})
}
#else
extern "C" __global__ void __launch_bounds__(SOLLAT_RMSNORM_BLOCK_THREADS, 1)
SOLLAT_RMSNORM_ENTRY(SOLLAT_RMSNORM_PARAMS) {
  SOLLAT_RMSNORM_BLOCK_BODY()
}
#endif
