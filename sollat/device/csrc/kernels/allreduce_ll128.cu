// Two-shot LL128 atomic AllReduce (fp32, bf16, fp16; sum only). Not deterministic: float atomics
// land in any order; vector f32 atomics flush denormals to zero; 16-bit types accumulate in their
// own precision (packed-pair atomics), not in fp32.
//
// Line protocol (lanes, counter, displaced elements, ordering): sollat/ll128.h.
//
// The message is cut into R chunks of whole warp-units (Traits<T>::kUnitElems user elements, 124
// fp32 or 248 16-bit); rank c owns chunk c. Warp w (global warp id over the grid) handles unit j
// = w, w + nwarps, ... of every chunk, one epoch per iteration:
//   reduce-scatter (buffer 0, accumulator): for every chunk c (own included) each lane adds its
//       16 B into owner c's accumulator line with one vector red (counter 1 in element 0 of lanes
//       0/8/16/24, the displaced elements in lane 31). The owner polls its 4 counters until they
//       read R, reads the lines, restores the displaced elements, zeroes the lines, fences.
//   all-gather (buffer 1, LL): lanes 0..30 bcast their reduced 16 B as two LL lines (kSlots = 2)
//       to every peer and write them; then receive the other chunks' unit j and write them.
//
// Buffer 0 layout (each rank's scratch, region 0): 16-byte line index
//       line_base(parity, 0) + ll128_acc_slot(blockIdx.x, threadIdx.x)   (layout.h)
//   i.e. the source-0 part of an LL region; a warp's unit is 32 consecutive 16-byte lines (512 B,
//   512-byte aligned if the region is). Zero at rest (the host zero-fills it once).
//   Epochs: buffer 0's epoch array, index ll128_acc_slot(...) (all lanes of a
//   warp hold the same value); parity = epoch & 1.
// Signature words (the reduce-scatter's call check; the all-gather is LL, whose flags carry the
// signature): the adds carry no signature, so an owner would sum a differing rank's adds once its
// counters read R and pass them on under its own signature. So in every iteration lane c of each
// warp stores ll128::SignatureWord::make(sig, epoch) (ll128.h: 8 bytes, one volatile store)
// into owner c's buffer 0 at part (parity, source 1) (which the accumulator lines, in part
// (parity, 0), never use), word ll128_signature_word(blockIdx.x, warp * 32 + own rank) (layout.h); the
// owner's lane q polls source q's word with its counter and completes only when it equals this
// call's (sig, epoch); this epoch with another signature is a call mismatch. Reuse: as the
// accumulator lines' (a source writes word e+2 after the owner's all-gather of e+1, sent after the
// owner's lanes read word e + 1 and, through the __syncwarp after the poll, every word of e).
// Buffer 1: a regular LLBuffer<ProtoLL, R, 2> region.
// Both regions are 2 * nranks * lines_per_src * 16 bytes; lines_per_src >= max_blocks * 2048.
//
// Launch: blockDim.x a multiple of 32 (<= 512); any grid. All co-resident on virtual ranks (as two-shot).
// In-place safe: a warp reads its R input units before writing exactly those positions.
//
// Module defines: SOLLAT_T (float, sollat::bf16, sollat::f16), SOLLAT_OP (OpSum only),
// SOLLAT_PROTO (ProtoLL), SOLLAT_MAX_RANKS, SOLLAT_SLOTS (1, unused), SOLLAT_LL128_SPLIT (0/1).
// Kernel: ll128.
#include "sollat/collective.h"
#include "sollat/ll128.h"

using namespace sollat;

constexpr int kBuffers = kLl128Buffers;  // abi.h (sollat/device/abi.py KERNELS)

// One lane's 16 bytes of a warp-unit.
template <typename T> using LanePack = Pack<T, ll128::kLaneBytes>;

// load_pack/store_pack (collective.h) with the element-wise path (tails, misaligned views) kept
// out of line: it is rare, and inlined R times over it costs registers the fast path needs.
template <typename T>
__device__ __noinline__ LanePack<T> load16_slow(const T* p, u64 e0, u64 n) {
  return load_pack<T, ll128::kLaneBytes>(p, e0, n, false);
}
template <typename T>
__device__ __noinline__ void store16_slow(T* p, u64 e0, u64 n, LanePack<T> v) {
  store_pack<T, ll128::kLaneBytes>(p, e0, n, false, v);
}
template <typename T>
__device__ __forceinline__ LanePack<T> load16(const T* p, u64 e0, u64 n, bool aligned) {
  if (aligned && e0 + LanePack<T>::kElems <= n) return *reinterpret_cast<const LanePack<T>*>(p + e0);
  return load16_slow<T>(p, e0, n);
}
template <typename T>
__device__ __forceinline__ void store16(T* p, u64 e0, u64 n, bool aligned, const LanePack<T>& v) {
  if (aligned && e0 + LanePack<T>::kElems <= n) *reinterpret_cast<LanePack<T>*>(p + e0) = v;
  else store16_slow<T>(p, e0, n, v);
}

template <typename T, int kMaxRanks, bool kSplit>
__device__ __forceinline__ void ll128_allreduce(const CallArgs& a, const T* in, T* out) {
  typedef LLBuffer<ProtoLL, kMaxRanks, 2> AG;
  typedef LanePack<T> P;
  typedef Pack<T, kPayloadBytesLL> H;  // half a lane: one LL line's payload
  typedef ll128::W4 W4;
  typedef ll128::CounterBits<T> CB;
  constexpr int E = P::kElems;
  constexpr int UE = ll128::Traits<T>::kUnitElems;
  constexpr unsigned kFull = 0xFFFFFFFFu;
  T* const tag = nullptr;  // overload selector for the ll128:: helpers

  const FaultSink fault = make_fault(a);
  const int R = a.nranks;
  const u64 region = region_bytes(R, a.lines_per_src);
  const int lane = threadIdx.x & 31;
  const int slot0 = slot_index(blockIdx.x, 0, threadIdx.x);
  AG ag(make_desc<kMaxRanks>(a, 1, region), fault, slot0);

  const BufferDesc<kMaxRanks> acc = make_desc<kMaxRanks>(a, 0, region);
  const int acc_slot = ll128_acc_slot(blockIdx.x, threadIdx.x);
  Line* const own_acc = select_base(acc, a.rank);
  u32 epoch = acc.epochs[acc_slot];

  const bool in_aligned = is_aligned(in, sizeof(P));
  const bool out_aligned = is_aligned(out, sizeof(P));
  const u64 units = (ceil_div_ranks<kMaxRanks>(a.n, R) + UE - 1) / UE;  // warp-units per chunk
  const u64 chunk_elems = units * UE;
  const int warps_per_block = blockDim.x >> 5;
  const u64 nwarps = (u64)gridDim.x * warps_per_block;
  const bool ctr_lane = (lane & (ll128::kLanesPerLine - 1)) == 0;
  const bool disp_lane = lane == ll128::kDisplacedLane;
  const int line_k = lane >> 3;
  // A faulted call leaves NaN in every output position this lane owns from unit `j0` on.
  auto poison_from = [&](u64 j0) {
    if (disp_lane) return;
    for (u64 jj = j0; jj < units; jj += nwarps)
      for (int c = 0; c < R; ++c) store16<T>(out, c * chunk_elems + jj * UE + (u64)lane * E, a.n, out_aligned, nan_pack<T, ll128::kLaneBytes>());
  };
  const u64 warp0 = (u64)blockIdx.x * warps_per_block + (threadIdx.x >> 5);
  if (refused(a)) return poison_from(warp0);
  // This warp's signature words: lane q's (source q's) in this rank's part, and where this rank's
  // word goes in owner `lane`'s part (layout.h ll128_signature_word, counted from the part's start).
  const int warp_thread0 = (int)(threadIdx.x & ~31u);
  const int word_in = ll128_signature_word(blockIdx.x, warp_thread0 + lane);
  const int word_out = ll128_signature_word(blockIdx.x, warp_thread0 + a.rank);
  const bool word_lane = lane < R && lane != a.rank;  // this lane carries source / owner `lane`'s word
  auto word_part = [&](Line* base, u64 parity) {
    return (ll128::SignatureWord::Word*)(base + line_base(parity, 1, R, (u64)a.lines_per_src));
  };

  for (u64 j = warp0; j < units; j += nwarps) {
    const u64 loff = line_base((u64)(epoch & 1), 0, R, (u64)a.lines_per_src) + acc_slot;  // this lane's 16 B in any owner
    const u64 lane_e = j * UE + (u64)lane * E;                // element offset inside a chunk
    // The previous iteration's all-gather receive (epoch e+1 from each owner) before this
    // iteration's adds into the owners' lines (epoch e+2): the receive is what says the owner has
    // read and zeroed that line (ll128.h, "Reuse"); PTX orders a load before a later store only
    // by a fence. None in the first iteration (the kernel boundary orders the previous call).
    ag.releaseReceives();

    // ---- reduce-scatter: this call's signature word to owner `lane`, then one vector add per
    // chunk into its owner's line (the word first: it lands no later than the adds)
    if (word_lane)
      st<Order::Volatile, Scope::Sys>(word_part(select_base(acc, lane), epoch & 1) + word_out,
                                      ll128::SignatureWord::make(a.sig, epoch));
#pragma unroll
    for (int c = 0; c < kMaxRanks; ++c) {
      if (c >= R) continue;
      P v;
      if (!disp_lane) v = load16<T>(in, c * chunk_elems + lane_e, a.n, in_aligned);
      else memset(&v, 0, sizeof(v));
      W4 w = bit_cast<W4>(v);
      const u32 x0 = w.w[0] & CB::kMask;  // element 0 (displaced on lanes 8k)
      const u32 d0 = __shfl_sync(kFull, x0, 0), d1 = __shfl_sync(kFull, x0, 8);
      const u32 d2 = __shfl_sync(kFull, x0, 16), d3 = __shfl_sync(kFull, x0, 24);
      if (disp_lane) {
        if (sizeof(T) == 4) { w.w[0] = d0; w.w[1] = d1; w.w[2] = d2; w.w[3] = d3; }
        else { w.w[0] = d0 | (d1 << 16); w.w[1] = d2 | (d3 << 16); w.w[2] = 0; w.w[3] = 0; }
      } else if (ctr_lane) {
        w.w[0] = (w.w[0] & ~CB::kMask) | (kSplit ? 0u : CB::kOne);
      }
      // Relaxed, system scope: every rank adds into these addresses; what orders the owner's read
      // after all R adds is the counter (ll128.h, "Ordering").
      red_add_v4<Order::Relaxed, Scope::Sys>(tag, select_base(acc, c) + loff, w.w);
    }
    if (kSplit) {
      __syncwarp();
      fence<peer_scope()>();  // split: the warp's data adds are performed before its counter adds (the owner's scope)
      if (ctr_lane) {
#pragma unroll
        for (int c = 0; c < kMaxRanks; ++c)
          if (c < R) red_add<Order::Relaxed, Scope::Sys>(tag, select_base(acc, c) + loff, ll128::counter_add(tag));
      }
    }

    // ---- owner: wait for R on the 4 counters (each lane polls its line's counter) and for the
    // peers' signature words (lane q polls source q's) ---------------------------------------
    Line* const my = own_acc + loff;
    {
      const u32* ctr = (const u32*)(own_acc + (loff & ~(u64)(ll128::kLanesPerLine - 1)));
      const ll128::SignatureWord::Word* word = word_part(own_acc, epoch & 1) + word_in;
      bool word_ok = !word_lane;
      Spin spin(fault);
      for (;;) {
        const u32 cw = ld<Order::Volatile, Scope::Sys>(ctr);  // a poll: never cached, never elided
        int wr = 1;
        if (!word_ok) {
          wr = ll128::SignatureWord::check(ld<Order::Volatile, Scope::Sys>(word), a.sig, epoch);  // with the counter poll
          word_ok = wr > 0;
        }
        const float cv = ll128::counter_value(tag, cw);
        const bool done = cv == (float)R && word_ok;
        if (__all_sync(kFull, done)) break;
        const bool over = cv > (float)R;  // some rank added twice: a call mismatch
        if (__any_sync(kFull, over || wr < 0)) {  // another call's counter or signature
          if (over) fault.raise(kMismatch, a.rank, -1, acc_slot, epoch, cw);
          else if (wr < 0) fault.raise(kMismatch, a.rank, lane, word_in / 2, epoch, ll128::SignatureWord::sig(ld<Order::Volatile, Scope::Sys>(word)));
          return poison_from(j);
        }
        const bool go = spin.again(a.rank, [&]() { return FaultAt{word_ok ? -1 : lane, word_ok ? acc_slot : word_in / 2, epoch}; });
        if (!__all_sync(kFull, go)) return poison_from(j);
      }
      // Every lane's word and counter reads before any lane's zeroing fence and all-gather sends
      // (which let the sources write this parity again): bar.warp.sync orders the lanes' accesses.
      __syncwarp();
    }
    if (kSplit) fence<peer_scope()>();  // split: acquire side of the counter, before the data read (the adders' scope)
    W4 r = bit_cast<W4>(ld<Order::Volatile, Scope::Sys>(my));  // fused: after the poll that saw R, same line
    // Restore element 0 of lanes 8k from lane 31's element k.
    {
      const u32 s0 = __shfl_sync(kFull, r.w[0], ll128::kDisplacedLane);
      const u32 s1 = __shfl_sync(kFull, r.w[1], ll128::kDisplacedLane);
      u32 x;
      if (sizeof(T) == 4) {
        const u32 s2 = __shfl_sync(kFull, r.w[2], ll128::kDisplacedLane);
        const u32 s3 = __shfl_sync(kFull, r.w[3], ll128::kDisplacedLane);
        x = line_k == 0 ? s0 : line_k == 1 ? s1 : line_k == 2 ? s2 : s3;
      } else {
        const u32 s = (line_k < 2) ? s0 : s1;
        x = (line_k & 1) ? (s >> 16) : (s & 0xFFFFu);
      }
      if (ctr_lane) r.w[0] = (r.w[0] & ~CB::kMask) | x;
    }
    // Zero the line for its next use; the fence orders the reads above and the zeroing before the
    // all-gather sends below, which let the peers add into it again (they fence in turn after
    // receiving them, at the top of their next iteration).
    st<Order::Volatile, Scope::Sys>(my, Line{0, 0});
    fence<peer_scope()>();

    // ---- all-gather: own unit to every peer (LL, two lines per lane), write, collect -------
    const P red = bit_cast<P>(r);
    if (!disp_lane) {
      const Line rl = bit_cast<Line>(r);
      ag.template bcast<T>(0, bit_cast<H>(rl.lo));
      ag.template bcast<T>(1, bit_cast<H>(rl.hi));
      store16<T>(out, a.rank * chunk_elems + lane_e, a.n, out_aligned, red);
    }
    H got[kMaxRanks][2];
    bool ok = true;
    if (!disp_lane) ok = ag.template recvGather<T>(2, got);
    if (!__all_sync(kFull, ok)) return poison_from(j);
    if (!disp_lane) {
#pragma unroll
      for (int c = 0; c < kMaxRanks; ++c) {
        if (c >= R || c == a.rank) continue;
        Line l;
        l.lo = bit_cast<u64>(got[c][0]);
        l.hi = bit_cast<u64>(got[c][1]);
        store16<T>(out, c * chunk_elems + lane_e, a.n, out_aligned, bit_cast<P>(l));
      }
    }
    ag.advanceEpoch();
    epoch += 1;
  }
  acc.epochs[acc_slot] = epoch;
  ag.commit();
}

template <class Op> struct IsSum { static constexpr bool value = false; };
template <> struct IsSum<OpSum> { static constexpr bool value = true; };

__device__ __forceinline__ void ll128_body(const CallArgs& a, const SOLLAT_T* in, SOLLAT_T* out) {
  static_assert(sizeof(SOLLAT_T) == 4 || sizeof(SOLLAT_T) == 2, "LL128 atomic: fp32, bf16, fp16 only");
  static_assert(IsSum<SOLLAT_OP>::value, "LL128 atomic: sum only");
  ll128_allreduce<SOLLAT_T, SOLLAT_MAX_RANKS, SOLLAT_LL128_SPLIT != 0>(a, in, out);
}
SOLLAT_DEFINE_ENTRY_POINTS(ll128, SOLLAT_T, ll128_body)
