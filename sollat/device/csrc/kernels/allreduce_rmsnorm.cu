// Fused AllReduce + residual add + RMSNorm (vLLM's fused_add_rms_norm after a tensor-parallel
// AllReduce), one-shot, push mode, barrier-free, written with the LLBuffer device API.
//
// Inputs per rank: x [rows, hidden] (this rank's partial sums), residual [rows, hidden], weight
// [hidden], eps. Every rank computes, for every row, the arithmetic of sollat/rmsnorm_math.h
// (stated once in docs/design.md, "Arithmetic and batch invariance"):
//   s   = round_T(x_0 + x_1 + ... + x_{R-1})        rank-order fp32 sum, rounded to T
//   r   = round_T(float(s) + float(residual))        (the unfused path's two roundings)
//   out = round_T( (float(r) * rstd) * float(weight) ),  rstd = 1 / sqrt(ss / hidden + eps)
// and writes r into res_out (which may be the residual itself). ss is the pairwise tree over
// float(r_e)^2 of the row, zero-padded to a power of two: the same bits whatever the cut below, the
// world size or the algorithm, and the same as kernels/add_rmsnorm.cu's (unfused), so every rank's
// outputs are bitwise identical, a row's bits do not depend on the batch it travels in, and
// rmsnorm.reference reproduces them bit for bit (tests/gpu/test_rmsnorm.py, test_batch_invariance.py).
//
// Cut: a row belongs to one thread-block cluster of k blocks (k = the launch's cluster width in x,
// 1, 2, 4 or 8; rmsnorm.row_geometry picks it): cluster c takes rows c, c + clusters, ...; a row is
// row_lines lines (line = kElems elements of the row), and line ((p * k + j) * kSlots + i) *
// blockDim.x + threadIdx.x belongs to pass p, block j of the cluster, slot i of the thread. Each
// pass is one epoch of the thread's line-channels: bcast the own lines, recvReduce in rank order
// (exactly as allreduce_oneshot.cu), round, add the residual. The sum of squares of a row:
//   * per line: square_tree (the pairwise tree over its kElems squares: a subtree);
//   * per warp, slot and pass: warp_tree_sum over its 32 lines, which are lines 32c .. 32c + 31 of
//     the row (blockDim.x is a multiple of 32): chunk c's sum, an aligned subtree (the slots'
//     butterflies interleaved: warp_tree_sums);
//   * each chunk's sum goes into slot [c] of every cluster block's chunk_sums: k == 1 a shared
//     store, then the block's __syncthreads_or; k > 1 a st.async into every receiving block (see
//     "Row exchange" below), with the chunk's fault word, counted on that block's mbarrier of the
//     row (row_bars), whose phase every thread of the block waits for: no cluster barrier per
//     row. Then every warp of every receiving block sums the row's chunks by row_tree_sum (the
//     tree over the chunks, zero-padded): the row's whole tree, computed redundantly with the
//     same bits.
//
// Row exchange (k > 1). The cut can leave warps, and whole blocks, without a line of the row (the
// threads round up to whole warps, so the last block of a cluster gets the remainder: 2880 bf16
// on LL leaves warp 5 of block 3 empty, 5376 bf16 on LL all of block 7). Which warps take part is
// the same in every row: warp w of block j holds a line iff its first one, line
// j * kSlots * blockDim.x + 32 w (pass 0, slot 0), is in the row, and then it holds chunk
// (j * kSlots * blockDim.x) / 32 + w of pass 0 and stores it in every row. With several passes
// every warp takes part (pass 1 exists only if pass 0 is full). A warp without a line has nothing
// to compute or write, so it leaves right after the cluster's arrive at entry (a block none of
// whose warps takes part leaves whole); the blocks that take part are 0 .. receivers - 1, and warp
// 0 of each takes part (its thread 0 declares the row's bytes). Invariant: every warp that waits
// on a block's row phase or reads its chunk words stores into every receiving block, its own
// included, in every row (rmsnorm.row_exchange and tests/cpu/test_rmsnorm_geometry.py check it for
// every hidden size, dtype and protocol). What it buys, with st.async's completion (PTX ISA,
// st.async: a weak store whose complete-tx on the mbarrier has release semantics at cluster
// scope; mbarrier.try_wait.acquire.cluster pairs with it):
//   * a phase never runs ahead of a waiter: row r + 2's phase of a block (the same mbarrier as row
//     r's) needs the row r + 2 stores of every warp that takes part, each issued after that warp's
//     wait for row r, so no warp's try_wait.parity (valid for the current or the previous phase
//     only) meets a barrier two phases on;
//   * no row's bytes count towards an earlier phase: a store of row r + 2 into block B follows its
//     warp's wait for row r + 1 in its own block, which needs the row r + 1 stores of B's warps,
//     issued after they saw B's phase of row r complete;
//   * no slot is overwritten before every reader is done with it: the argument at the parity
//     reuse below.
// Every add and multiply is a single rounded PTX instruction (add.rn / mul.rn are never fused into
// an FMA); the divisions and the square root are IEEE (div.rn, sqrt.rn), not rsqrt.approx.
//
// Faults: refused() at entry (k == 1: NaN into every output this thread owns, nothing sent; k > 1:
// the thread runs the first row as a faulted one, below, so that the cluster's blocks decide
// together); a thread whose recvReduce gives up (timeout, call mismatch, a peer's fault) stops
// sending and receiving (it still runs the row's passes, sending nothing, so that every lane of
// its warp reaches each chunk's butterfly). The block learns of it at the row's __syncthreads_or
// (k == 1), the cluster from the chunks' fault words (k > 1): then every thread of the cluster
// writes NaN into its lines of both outputs from that row on, and nobody commits epochs. A block
// never leaves while a sibling may still store into its shared memory: every exit of a receiving
// block is after its wait for the row's phase, which every store into it of that row precedes,
// and nobody sends a later row; a block that takes no part receives nothing.
//
// FP8 copy (module define SOLLAT_RMSNORM_FP8=1; vLLM's fused_add_rms_norm_static_fp8_quant): the
// epilogue also writes, per element, the float8_e4m3fn byte
//   q = e4m3_satfinite_rn( float(out) / scale )        scale = *fp8_scale (float32), read each launch
// i.e. the output AFTER its rounding to T (vLLM quantises the value it would have stored), divided
// by the scale with div.rn (vLLM multiplies by a rounded 1 / scale instead: that can differ by one
// e4m3 step where the quotient lies within an fp32 ulp of a rounding tie), then converted by
// cvt.rn.satfinite.e4m3x2.f32 (what cuda_fp8.h's __nv_cvt_float_to_fp8(v, __NV_SATFINITE,
// __NV_E4M3) is on sm_89+; that header is not reachable under NVRTC here): round to nearest even,
// everything beyond +-448 (+-Inf included) saturates to +-448, which equals clamping to +-448 first.
// Every NaN is written as kFp8E4M3NaN (0x7F, whatever the sign): the instruction's NaN bits are
// not relied on (vLLM's fminf/fmaxf clamp turns a NaN into 448; torch.clamp + .to(float8_e4m3fn)
// keeps the sign, 0xFF for a negative NaN). rmsnorm.fp8_reference replays it. A faulted or refused
// call writes 0x7F into the copy too. The define only adds code: without it the module is the
// plain kernel, instruction for instruction.
//
// Two-shot (module define SOLLAT_RMSNORM_TWOSHOT=1; algorithm rmsnorm_twoshot_sentinel):
// the same cut, the same arithmetic and the same epilogue; only each pass's exchange differs. Row
// `row` is owned by rank row % R (strided, sollat/collectives/rmsnorm.py row_owner; with fewer rows than ranks
// the ranks >= rows own none). In every pass, on the thread's channels:
//   reduce-scatter (buffer 0): a non-owner sends its x lines to the owner only; the owner receives
//                  every peer's and sums them in rank order 0..R-1 in fp32 (recvReduce: exactly
//                  the one-shot's sum);
//   all-gather     (buffer 1): the owner bcasts that fp32 sum (a 16-bit line's sums take two
//                  lines: kWiden) and keeps the bits the peers receive; a non-owner receives it.
// Then every rank rounds that sum to T, adds ITS OWN residual and rounds again (r, as in the
// one-shot: residual_add), stores r into res_out and puts its lines' squares into the row's chunks,
// and after the last pass runs the one-shot's sum of squares and normalisation on its r: y and the FP8 copy are computed on every rank, not gathered. So the
// results are the one-shot's bit for bit (rmsnorm.reference), whatever
// the ranks' residuals and weights. Gathering the sum, not y, is also what keeps the exchange per
// pass: y needs the whole row's ss, i.e. every pass of a row in flight without credit. Per line of
// a row each rank receives R - 1 lines (owner) or kWiden lines (the others) instead of R - 1.
//
// Credit across the two buffers (ll_buffer.h's argument, per pair): in every pass an owner o and a
// non-owner s make one round trip, s -> o on buffer 0, then o -> s on buffer 1, and o sends its
// buffer-1 line only after its buffer-0 receive (program order, data dependence); two non-owners
// exchange nothing (their lines are other lines: one per source). So when s writes buffer 0's
// line of parity p again (epoch e+2, whoever owns that row), it has received o's buffer-1 line of
// epoch e, sent after o read s's epoch e; when o writes buffer 1's line again at e+2, it has
// received s's buffer-0 line of epoch e+2, sent after s read o's epoch e. Each buffer alone
// carries traffic one way only: its credit is the other's. Sentinel: the resets of one buffer are
// fenced (releaseReceives) before the other buffer's send that frees them for the peer. Every rank
// uses the thread's channels in every pass (as sender or receiver), so the epochs agree.
//
// Module defines (sollat/collectives/algorithms.py): SOLLAT_T (float, sollat::bf16, sollat::f16), SOLLAT_PROTO
// (ProtoLL, ProtoSentinel), SOLLAT_MAX_RANKS (2, 4, 8), SOLLAT_SLOTS (1, 2, 4), SOLLAT_RMSNORM_FP8
// (0 or absent, 1), SOLLAT_RMSNORM_TWOSHOT (0 or absent, 1); SOLLAT_OP is OpSum and not used.
// Kernels: ar_rmsnorm (parameters: abi.h SOLLAT_RMSNORM_PARAMS), with SOLLAT_RMSNORM_FP8 instead
// ar_rmsnorm_fp8 (SOLLAT_RMSNORM_FP8_PARAMS); the two-shot's are named ar_rmsnorm_twoshot and
// ar_rmsnorm_twoshot_fp8 (abi.rmsnorm_entry), with the same parameters.
#include "sollat/collective.h"
#include "sollat/rmsnorm_math.h"

#ifndef SOLLAT_RMSNORM_FP8
#define SOLLAT_RMSNORM_FP8 0
#endif
#ifndef SOLLAT_RMSNORM_TWOSHOT
#define SOLLAT_RMSNORM_TWOSHOT 0
#endif

using namespace sollat;

// abi.h (sollat/device/abi.py KERNELS): the one-shot runs on one buffer, the two-shot on two.
constexpr int kBuffers = SOLLAT_RMSNORM_TWOSHOT ? kArRmsnormTwoshotBuffers : kArRmsnormBuffers;

namespace {

// The row's thread-block cluster (PTX special registers, sm_90): k = blocks per row (1 when the
// launch has no cluster or a cluster across virtual ranks only), j = this block's place in it.
__device__ __forceinline__ int row_cluster_width() {
  u32 v; asm("mov.u32 %0, %%cluster_nctaid.x;" : "=r"(v)); return (int)v;
}
__device__ __forceinline__ int row_cluster_index() {
  u32 v; asm("mov.u32 %0, %%cluster_ctaid.x;" : "=r"(v)); return (int)v;
}
__device__ __forceinline__ u32 cluster_block_rank() {
  u32 v; asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(v)); return v;
}

__device__ __forceinline__ u32 shared_addr(const void* p) { return (u32)__cvta_generic_to_shared(p); }

// The address of the same __shared__ object in block `rank` of this cluster (DSMEM).
__device__ __forceinline__ u32 cluster_addr(const void* local, u32 rank) {
  u32 remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(shared_addr(local)), "r"(rank));
  return remote;
}

// The row exchange of a k-block cluster runs on one mbarrier per row parity in every receiving
// block: its phase completes when the block's thread 0 has arrived (declaring the row's bytes)
// and every byte of the row's st.async stores into this block has landed. A st.async is a weak
// store whose complete-tx has release semantics at cluster scope (PTX ISA, st.async); a thread
// whose mbarrier.try_wait.acquire.cluster sees the phase complete reads the bytes it counted. No
// cluster barrier per row: a block waits only for the stores meant for it.
__device__ __forceinline__ void mbar_init(u64* bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(shared_addr(bar)) : "memory");
}
// Makes this thread's mbarrier.init visible at cluster scope to the release of the next
// barrier.cluster.arrive (relaxed arrive: this fence is its only release).
__device__ __forceinline__ void fence_mbar_init() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }
__device__ __forceinline__ void cluster_arrive_relaxed() { asm volatile("barrier.cluster.arrive.relaxed;" ::: "memory"); }
// Acquire: after it, every block's initialised mbarriers (fenced before its arrival) may be
// signalled. Not .aligned: callers are not promised to be converged.
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire;" ::: "memory"); }
__device__ __forceinline__ void fence_acq_rel_cluster() { asm volatile("fence.acq_rel.cluster;" ::: "memory"); }
// Thread 0's arrival on its own block's phase, with the bytes the phase waits for.
__device__ __forceinline__ void mbar_expect(u64* bar, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(shared_addr(bar)), "r"(bytes) : "memory");
}
// v into the word at `word` (a shared::cluster address), counted on the mbarrier at `bar` of the
// same block.
__device__ __forceinline__ void st_async(u32 word, u32 v, u32 bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.u32 [%0], %1, [%2];" ::"r"(word), "r"(v), "r"(bar)
               : "memory");
}
__device__ __forceinline__ bool mbar_try_wait(u64* bar, u32 parity) {
  u32 done;
  asm volatile(
      "{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n\t"
      "selp.u32 %0, 1, 0, p;\n\t}"
      : "=r"(done)
      : "r"(shared_addr(bar)), "r"(parity)
      : "memory");
  return done != 0u;
}

// The one-shot's stand-in for the two-shot's second buffer: nothing, no code (the two-shot's
// exchange, which names recvUnrolled and bcast, is never called in the one-shot).
struct NoBuffer {
  template <class... Args> __device__ __forceinline__ explicit NoBuffer(const Args&...) {}
  template <typename T, class V> __device__ __forceinline__ V bcast(int, const V& v) { return v; }
  template <typename T, class... Args> __device__ __forceinline__ bool recvUnrolled(const Args&...) { return false; }
  __device__ __forceinline__ void releaseReceives() {}
  __device__ __forceinline__ void advanceEpoch() {}
  __device__ __forceinline__ void commit() {}
};
template <bool kOn, class B> struct SecondBuffer { typedef NoBuffer type; };
template <class B> struct SecondBuffer<true, B> { typedef B type; };

}  // namespace

template <typename T, class Proto, int kMaxRanks, int kSlots, bool kFp8, bool kTwoShot>
__device__ __forceinline__ void ar_rmsnorm(const CallArgs& a, u64 hidden, float eps, const T* in, T* out,
                                           const T* res, T* res_out, const T* weight, Fp8Out fp8) {
  typedef LLBuffer<Proto, kMaxRanks, kSlots> Buf;
  typedef typename Buf::template PackT<T> P;
  typedef typename Buf::template AccT<T> A;
  constexpr int kElems = P::kElems;
  constexpr int kBytes = (int)sizeof(P);
  // Two-shot: the all-gather carries fp32 sums (each rank rounds them and adds its own residual,
  // as in the one-shot): kWiden lines of kPiece floats per line of T.
  constexpr int kWiden = (int)(sizeof(float) / sizeof(T));
  static_assert(!kTwoShot || kSlots * kWiden <= kMaxSlotsPerThread, "the all-gather's channels per thread");
  typedef LLBuffer<Proto, kMaxRanks, kSlots * kWiden> AgBuf;
  typedef typename AgBuf::template PackT<float> F;
  constexpr int kPiece = F::kElems;
  static_assert(kPiece * kWiden == kElems, "a line's sums fill kWiden lines");
  constexpr int kChunks = RmsnormChunks<T, kBytes>::value;  // chunks of a row of rmsnorm.MAX_HIDDEN
  static_assert(kChunks <= kRmsnormMaxChunks && kChunks % 4 == 0, "row_tree_sum covers the row, rows 16-byte aligned");
  // By row parity: a fast block's next row never overwrites sums a slow one has not read yet (the
  // argument is at the parity reuse below). [c]: chunk c's sum (float bits), stored by the warp
  // that holds it (into every receiving block of the cluster).
  __shared__ __align__(16) u32 chunk_sums[2][kChunks];  // 16-byte rows: row_tree_sum
  __shared__ u32 chunk_faults[2][kChunks];        // by row parity: [c] 1 when chunk c's warp met a fault (k > 1)
  __shared__ __align__(8) u64 row_bars[2];         // by row parity: the row exchange's mbarrier (k > 1)

  const u64 rows = a.n / hidden;
  const int k = row_cluster_width();
  const int j = row_cluster_index();
  const u32 row_step = gridDim.x / (u32)k;  // clusters in the grid
  const int row_lines = (int)((hidden + kElems - 1) / kElems);
  const int n_chunks = (row_lines + kWarpSize - 1) / kWarpSize;  // chunks holding lines of the row
  const int threads = (int)blockDim.x;  // a multiple of 32 (rmsnorm.row_geometry)
  const int passes = (row_lines + k * threads * kSlots - 1) / (k * threads * kSlots);  // as rmsnorm.row_geometry
  const int lane = (int)threadIdx.x & (kWarpSize - 1);
  const int warp = (int)threadIdx.x / kWarpSize;
  const u32 first_block = cluster_block_rank() - (u32)j;  // block 0 of this row cluster (x is the fastest dimension)
  const int pass_lines = k * kSlots * threads;                     // lines of a row per pass
  const int line0 = j * kSlots * threads + (int)threadIdx.x;        // this thread's first line
  auto line_of = [&](int p, int i) { return p * pass_lines + i * threads + line0; };
  // The first line of this warp's chunk of slot i in pass p (a multiple of 32; the same in every lane).
  auto chunk_line = [&](int p, int i) { return p * pass_lines + (j * kSlots + i) * threads + warp * kWarpSize; };
  // k > 1, "Row exchange" at the top: whether this warp holds a line of a row (then it stores its
  // pass-0 slot-0 chunk into every receiving block in every row), and the receiving blocks 0 ..
  // receivers - 1, those that hold a line (rmsnorm.row_exchange).
  const bool takes_part = chunk_line(0, 0) < row_lines;
  const int block_lines = kSlots * threads;  // lines of a row per block and pass
  const int row_blocks_used = (row_lines + block_lines - 1) / block_lines;
  const int receivers = row_blocks_used < k ? row_blocks_used : k;
  // Lines of pass p that this thread holds: a prefix of its slots (lines grow with the slot).
  auto active_in = [&](int p) {
    int n = 0;
#pragma unroll
    for (int i = 0; i < kSlots; ++i)
      if (line_of(p, i) < row_lines) n = i + 1;
    return n;
  };
  // Line `line` of row `row` of a [rows, hidden] tensor (zeros past the row's end). Rows need not
  // be line-aligned (odd hidden sizes): a misaligned row takes the element path.
  auto load_row = [&](const T* base, u64 row, int line) {
    const T* r = base + row * hidden;
    return load_pack<T, kBytes>(r, (u64)line * kElems, hidden, is_aligned(r, kBytes));
  };
  // Lines i < active of pass p of a row into v. Whole rows (hidden a multiple of a line, every
  // tensor line-aligned) load without a branch, a slot past the row's end loading line 0 again (in
  // bounds, never used): a load under a branch is unpacked (PRMT, one 16-bit register per element)
  // inside the branch, which waits for its data, so each slot's load would wait for the previous
  // one's. Not a generic lambda (NVRTC 13.0).
  const bool whole = hidden % (u64)kElems == 0 && is_aligned(in, kBytes) && is_aligned(res, kBytes) &&
                     is_aligned(weight, kBytes);
  auto load_slots = [&](const T* base, u64 row, int p, int active, P (&v)[kSlots]) {
    if (whole) {
#pragma unroll
      for (int i = 0; i < kSlots; ++i) {
        const int line = line_of(p, i);
        v[i] = *reinterpret_cast<const P*>(base + row * hidden + (u64)(line < row_lines ? line : 0) * kElems);
      }
    } else {
#pragma unroll
      for (int i = 0; i < kSlots; ++i)
        if (i < active) v[i] = load_row(base, row, line_of(p, i));
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
    for (u64 row = first; row < rows; row += row_step)
      for (int p = 0; p < passes; ++p)
#pragma unroll
        for (int i = 0; i < kSlots; ++i) {
          const int line = line_of(p, i);
          if (line < row_lines) {
            store_row(out, row, line, nan);
            store_row(res_out, row, line, nan);
            if constexpr (kFp8) store_q(row, line, 0x0101010101010101ull * (u64)kFp8E4M3NaN);
          }
        }
  };

  // The first input loads go out before the buffer is set up (as in the one-shot AllReduce).
  const u32 first_row = blockIdx.x / (u32)k;
  P own[kSlots];
  int active = active_in(0);
  load_slots(in, first_row, 0, active, own);
  // A row cluster's blocks store into each other's shared memory, so none of them may leave
  // before it has received every store meant for it: a block of a cluster that refuses the call
  // runs the first row as a faulted thread does (nothing sent), and the row's exchange, which
  // every receiving block joins, makes the whole cluster write NaN from there. Its mbarriers are
  // initialised and announced now; the wait for every sibling's announcement comes right before
  // the first remote store, so it is off the exchange with the peers.
  bool refuses = false;
  if (k == 1) {
    if (refused(a)) return poison_from(first_row);
  } else {
    if (threadIdx.x == 0) {
      mbar_init(&row_bars[0]);
      mbar_init(&row_bars[1]);
      fence_mbar_init();
    }
    cluster_arrive_relaxed();
    refuses = refused(a);
    // A warp without a line leaves (warp-uniform; its lanes arrived above, and barrier.cluster.wait
    // waits only for threads that have not exited): nothing it would do is needed by anyone, and
    // nothing is sent to a block none of whose warps takes part. Thread 0 of a receiving block
    // stays (warp 0 of a block that holds a line holds one).
    if (!takes_part) return;
  }
  const FaultSink fault = make_fault(a);
  Buf buf(make_desc<kMaxRanks>(a, 0, region_bytes(a.nranks, a.lines_per_src)), fault,
          slot_index(blockIdx.x, 0, threadIdx.x));
  // Two-shot: buffer 1, the all-gather of the fp32 sums: kWiden lines per line of T (a 16-bit
  // line's sums fill two lines), on channels slot0 + c * kSlotStride, c < kSlots * kWiden (the
  // first kSlots of them are buffer 0's channel numbers, in buffer 1's own region and epochs).
  typename SecondBuffer<kTwoShot, AgBuf>::type ag(make_desc<kMaxRanks>(a, 1, region_bytes(a.nranks, a.lines_per_src)),
                                                 fault, slot_index(blockIdx.x, 0, threadIdx.x));
  // The scale, on the device at every launch (a graph replay sees its current value); the load
  // has the whole exchange to arrive.
  float scale = 0.0f;
  if constexpr (kFp8) scale = *fp8.scale;

  // Two-shot: one pass's exchange of row `row` (see the top of the file): r of each active line
  // into rs[i], on every rank the bits the one-shot computes there; the last pass also loads the
  // weight into wt. False on a fault (recorded; nothing more may be sent). (Not a generic lambda:
  // NVRTC 13.0 takes a generic lambda's operator() for a host function.)
  auto twoshot_pass = [&](u64 row, int p, bool last, int active, const P (&mine)[kSlots], P (&wt)[kSlots],
                          P (&rs)[kSlots]) -> bool {
    const int owner = (int)(row % (u64)a.nranks);  // rmsnorm.row_owner
    if (owner != a.rank) {
      // Sentinel: the buffer-1 lines reset so far land before this send, which frees them for the owner.
      ag.releaseReceives();
#pragma unroll
      for (int i = 0; i < kSlots; ++i)
        if (i < active) buf.template send<T>(owner, i, mine[i]);
    }
    P r_in[kSlots];  // this rank's residual (and the weight) load while the lines travel
    load_slots(res, row, p, active, r_in);
    if (last) load_slots(weight, 0, p, active, wt);
    F sums[kSlots * kWiden];  // the fp32 sums of the pass's lines: piece w of line i at [i * kWiden + w]
    if (owner != a.rank) {
      if (!ag.template recvUnrolled<float>(owner, active * kWiden, sums)) return false;
    } else {
      A acc[kSlots];
      if (!buf.template recvReduce<T, OpSum>(active, mine, acc)) return false;
      // Sentinel: the buffer-0 lines just reset land before the bcast, which frees them for the peers.
      buf.releaseReceives();
#pragma unroll
      for (int i = 0; i < kSlots; ++i)
#pragma unroll
        for (int w = 0; w < kWiden; ++w) {
          if (i >= active) continue;
          F f;
#pragma unroll
          for (int e = 0; e < kPiece; ++e) f.v[e] = acc[i].v[w * kPiece + e];
          sums[i * kWiden + w] = ag.template bcast<float>(i * kWiden + w, f);  // as the peers receive it
        }
    }
#pragma unroll
    for (int i = 0; i < kSlots; ++i) {
      if (i >= active) continue;
      P r;  // the one-shot's r: the rank-order fp32 sum rounded to T, plus this rank's residual, rounded
#pragma unroll
      for (int w = 0; w < kWiden; ++w)
#pragma unroll
        for (int e = 0; e < kPiece; ++e)
          r.v[w * kPiece + e] = residual_add<T>(sums[i * kWiden + w].v[e], r_in[i].v[w * kPiece + e]);
      rs[i] = r;
    }
    return true;
  };

  // Chunk c's sum into slot [c] of every receiving block of the row cluster. Ordering: a plain
  // shared store (k == 1), made visible to the block's readers by the row's __syncthreads_or
  // below; or (k > 1) one st.async per receiving block of the sum and one of whether the chunk's
  // warp met a fault (`bad`), counted on that block's row_bars[parity], whose phase its readers
  // wait for (acquire, cluster scope) before they read.
  auto put_chunk = [&](int parity, int c, float v, bool bad) {
    if (k == 1) {
      if (lane == 0) chunk_sums[parity][c] = __float_as_uint(v);
    } else if (lane < receivers) {
      const u32 to = first_block + (u32)lane;
      const u32 bar = cluster_addr(&row_bars[parity], to);
      st_async(cluster_addr(&chunk_sums[parity][c], to), __float_as_uint(v), bar);
      st_async(cluster_addr(&chunk_faults[parity][c], to), bad ? 1u : 0u, bar);
    }
  };
  // Bytes each receiving block receives per row: every chunk's sum and fault word (each chunk is
  // held by one warp, which stores both into every receiving block).
  const u32 row_bytes_in = (u32)n_chunks * 2u * (u32)sizeof(u32);
  // The row's phase of row_bars[parity] (k > 1). The siblings are resident together and store
  // their chunks of every row whatever happens, after that row's receives: one per pass, each
  // bounded by the call's timeout and cut short by a fault recorded anywhere. So a late peer is
  // named by the thread that waited for it, and this wait, which cannot tell which peer its
  // sibling waits for, must not time out first: it allows passes + 1 timeouts (the sibling's row
  // started no later than this wait, give or take the time to see a completed phase). Only a
  // sibling that neither delivers nor gives up in that time is recorded here, as this rank's own.
  const u64 row_timeout_ns = fault.timeout_ns * (u64)(passes + 1);
  auto wait_row = [&](int parity, u32 phase) -> bool {
    if (mbar_try_wait(&row_bars[parity], phase)) return true;
    const u64 start = globaltimer();
    while (!mbar_try_wait(&row_bars[parity], phase)) {
      if ((long long)(globaltimer() - start) > (long long)row_timeout_ns) {
        fault.raise(kTimeout, a.rank, a.rank, -1, 0u, 0u);
        return false;
      }
    }
    return true;
  };

  int parity = 0;
  u32 phases = 0;            // bit b: the phase row_bars[b] completes next
  bool announced = k == 1;   // every sibling's mbarriers are initialised (cluster_wait done)
  for (u64 row = first_row; row < rows; row += row_step, parity ^= 1) {
    bool ok = !refuses;
    // The row's bytes, declared by thread 0 after its wait for this mbarrier's previous phase
    // (program order); a sibling's store may land before it (the phase waits for both).
    if (k > 1 && threadIdx.x == 0) mbar_expect(&row_bars[parity], row_bytes_in);
    P kept[kSlots];  // the last pass's r and weight stay in registers for the normalisation
    P wt[kSlots];
    for (int p = 0; p < passes; ++p) {
      float part[kSlots];  // square_tree of each slot's line (0: no line, or after a fault)
#pragma unroll
      for (int i = 0; i < kSlots; ++i) part[i] = 0.0f;
      // A thread that met a fault sends and receives nothing more (no early exit: it still joins
      // its warp's butterflies below, which need every lane).
      if (ok) {
        if (p > 0 || row != (u64)first_row) {
          active = active_in(p);
          load_slots(in, row, p, active, own);
        }
      }
      // No line in this pass: the thread's channels keep their epochs (nothing sent or received).
      // A thread whose receive failed sends and receives nothing more; the block learns of it at
      // the row's barrier below and writes NaN.
      if (ok && active > 0) {
        // r of line i of this pass, as every rank has it: into res_out and the line's squares.
        auto take = [&](int i, const P& r) {
          store_row(res_out, row, line_of(p, i), r);
          part[i] = square_tree(r);  // past the row's end: +0 elements, +0 squares
          kept[i] = r;
        };
        if constexpr (kTwoShot) {
          P rs[kSlots];
          if (twoshot_pass(row, p, p == passes - 1, active, own, wt, rs)) {
#pragma unroll
            for (int i = 0; i < kSlots; ++i)
              if (i < active) take(i, rs[i]);
            buf.advanceEpoch();
            ag.advanceEpoch();
          } else {
            ok = false;  // fault recorded
          }
        } else {
          // The residual (and, in the last pass, the weight) loads go out before the send, which
          // waits for the input's: both memory latencies overlap, and the peers' lines' travel.
          P r_in[kSlots];
          load_slots(res, row, p, active, r_in);
          if (p == passes - 1) load_slots(weight, 0, p, active, wt);
#pragma unroll
          for (int i = 0; i < kSlots; ++i)
            if (i < active) own[i] = buf.template bcast<T>(i, own[i]);
          A acc[kSlots];
          if (buf.template recvReduce<T, OpSum>(active, own, acc)) {
#pragma unroll
            for (int i = 0; i < kSlots; ++i) {
              if (i >= active) continue;
              P r;
#pragma unroll
              for (int e = 0; e < kElems; ++e) r.v[e] = residual_add<T>(acc[i].v[e], r_in[i].v[e]);
              take(i, r);
            }
            buf.advanceEpoch();
          } else {
            ok = false;  // fault recorded
          }
        }
      }
      // The chunks of this pass, every slot's butterfly interleaved (every lane: the pass loop is
      // warp-uniform); a slot past the row's last chunk sums zeros and is not stored.
      warp_tree_sums(part);
      if (!announced) {
        cluster_wait();
        announced = true;
      }
      // A fault of any lane so far marks the warp's chunks (k > 1: the cluster learns of it there).
      const bool warp_bad = k > 1 && __any_sync(0xFFFFFFFFu, !ok);
#pragma unroll
      for (int i = 0; i < kSlots; ++i) {
        const int first = chunk_line(p, i);
        if (first < row_lines) put_chunk(parity, first / kWarpSize, part[i], warp_bad);
      }
    }

    // Whether any thread of the cluster met a fault: k == 1, the block's barrier, which also makes
    // the chunk sums visible to every thread; k > 1, every chunk's fault word, which every warp of
    // the cluster reads after the row's phase (the same words everywhere: the same verdict).
    bool bad;
    if (k == 1) {
      bad = __syncthreads_or(!ok);
    } else {
      // Every thread waits for the phase: then every store of the row into this block has landed
      // (so leaving, on NaN below, is safe) and is visible to this thread's reads.
      const bool arrived = wait_row(parity, (phases >> parity) & 1u);
      phases ^= 1u << parity;
      bool seen = !arrived;
      for (int c = lane; c < n_chunks; c += kWarpSize) seen |= chunk_faults[parity][c] != 0u;
      bad = __any_sync(0xFFFFFFFFu, seen);
    }
    if (bad) return poison_from(row);
    // Parity reuse: chunk_sums[parity] and chunk_faults[parity] are written again two rows on.
    // Every reader of them here is a warp that takes part (the others have left), and every such
    // warp of this block stores its chunk of the next row into every receiving block: lanes
    // 0 .. receivers - 1, after every lane's reads here. A sibling stores into these slots again
    // only after its wait for the next row in its own block, which needs those stores. The order
    // (where this cluster has a row two rows on): each lane's reads; __syncwarp (bar.warp.sync
    // orders memory among the lanes it joins); the storing lanes' fence.acq_rel.cluster; their
    // st.async of the next row, whose complete-tx (release, cluster scope) the sibling's
    // try_wait.acquire.cluster observes; the sibling's later st.async into these slots. The fence
    // comes before the row's own output stores, so it waits for few stores. (k == 1: the next
    // row's __syncthreads_or orders them.)
    const float total = row_tree_sum(chunk_sums[parity], n_chunks);
    if (k > 1 && row + 2 * (u64)row_step < rows) {
      __syncwarp();
      fence_acq_rel_cluster();
    }
    const float rstd = div_rn(1.0f, sqrt_rn(add_rn(div_rn(total, (float)hidden), eps)));

    for (int p = 0; p < passes; ++p) {
      const bool last = p == passes - 1;
#pragma unroll
      for (int i = 0; i < kSlots; ++i) {
        const int line = line_of(p, i);
        if (line >= row_lines) continue;
        // Earlier passes read back what this thread stored into res_out (same thread, same
        // address: program order), the last one is still in registers.
        const P r = last ? kept[i] : load_row(res_out, row, line);
        const P w = last ? wt[i] : load_row(weight, 0, line);
        P y;
#pragma unroll
        for (int e = 0; e < kElems; ++e) y.v[e] = from_acc<T>(mul_rn(mul_rn(to_acc(r.v[e]), rstd), to_acc(w.v[e])));
        store_row(out, row, line, y);
        if constexpr (kFp8) {  // the stored (rounded) y, divided by the scale, to e4m3
          store_q(row, line, e4m3_word(y, scale));
        }
      }
    }
  }
  buf.commit();
  ag.commit();
}

__device__ __forceinline__ void ar_rmsnorm_body(const CallArgs& a, u64 hidden, u32 eps_bits, const void* in,
                                                void* out, const void* res, void* res_out, const void* weight,
                                                Fp8Out fp8 = Fp8Out{nullptr, nullptr}) {
  typedef SOLLAT_T T;
  ar_rmsnorm<T, SOLLAT_PROTO, SOLLAT_MAX_RANKS, SOLLAT_SLOTS, SOLLAT_RMSNORM_FP8 != 0, SOLLAT_RMSNORM_TWOSHOT != 0>(
      a, hidden, bit_cast<float>(eps_bits), (const T*)in, (T*)out, (const T*)res, (T*)res_out, (const T*)weight, fp8);
}

// Entry points, as SOLLAT_DEFINE_ENTRY_POINTS (collective.h) defines them for the AllReduce, with
// three more tensors per rank in the rank table (five with the FP8 copy and its scale) and the
// row length and eps after the common tail. The FP8 module has only the FP8 entry, the plain
// module only the plain; both run one body (the macro below), the FP8 one with the Fp8Out
// argument appended.
#define SOLLAT_RMSNORM_BODY(...)                                                                              \
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
  ar_rmsnorm_body(a, hidden, eps_bits, in, out, res, res_out, weight __VA_ARGS__);

// Entry-point names by variant (abi.rmsnorm_entry): ar_rmsnorm[_twoshot][_fp8].
#if SOLLAT_RMSNORM_TWOSHOT
#define SOLLAT_RMSNORM_ENTRY ar_rmsnorm_twoshot
#define SOLLAT_RMSNORM_FP8_ENTRY ar_rmsnorm_twoshot_fp8
#else
#define SOLLAT_RMSNORM_ENTRY ar_rmsnorm
#define SOLLAT_RMSNORM_FP8_ENTRY ar_rmsnorm_fp8
#endif

#if SOLLAT_RMSNORM_FP8
extern "C" __global__ void __launch_bounds__(sollat::kRmsnormMaxThreads, 1)
SOLLAT_RMSNORM_FP8_ENTRY(SOLLAT_RMSNORM_FP8_PARAMS) {
  SOLLAT_RMSNORM_BODY(, Fp8Out{(unsigned char*)ptrs.at(sollat::kListFp8Out, y),
                               (const float*)ptrs.at(sollat::kListFp8Scale, y)})
}
#else
extern "C" __global__ void __launch_bounds__(sollat::kRmsnormMaxThreads, 1)
SOLLAT_RMSNORM_ENTRY(SOLLAT_RMSNORM_PARAMS) {
  SOLLAT_RMSNORM_BODY()
}
#endif
