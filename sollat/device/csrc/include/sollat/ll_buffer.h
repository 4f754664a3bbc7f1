// sollat/ll_buffer.h - the low-latency buffer: sollat's device API for barrier-free collectives.
//
// An LLBuffer is one thread's view of a region of symmetric scratch memory, in LL or sentinel
// mode (the Proto template parameter: ProtoLL from protocol_ll.h, ProtoSentinel from
// protocol_sentinel.h). It mirrors the paper's ncclLLBuffer: thread-level send, recv,
// recvUnrolled, recvReduce, bcast and advanceEpoch. Collectives are written with it; see
// kernels/allreduce_oneshot.cu for a complete example.
//
// Line-channels and epochs (the rules, shared with sollat/device/layout.py and the protocol model):
//   * A thread owns kSlots line-channels: slot indices  s_i = (block * MAX_SLOTS + i) * MAX_THREADS
//     + threadIdx.x,  i < kSlots. Channel s on rank r talks only to channel s on every peer
//     (one exception, sendToSlot: the wide one-shot pairs channels of different threads; why its
//     epochs still agree is argued in kernels/allreduce_oneshot_wide.cu).
//   * Every channel has its own epoch counter per rank (in device memory, so CUDA graphs replay
//     correctly). The constructor loads it, commit() stores it. advanceEpoch() increments the
//     counters of the channels used since the last advance; unused channels keep theirs. Since
//     every rank runs the same calls cut the same way, counters agree across ranks.
//   * Double buffering: a line exists in two parities (epoch & 1). The sender writes parity
//     e & 1 into the receiver's region at [parity][source = sender][slot].
//
// Why reuse is safe without a barrier (the credit argument): a sender writes a channel's line of
// parity p at epoch e+2 only after it received epoch e+1 on that channel from the same peer; the
// peer sent e+1 only after it finished reading (and, in sentinel mode, resetting the lines and
// signature words of) epoch e. PTX orders neither a load before a later store of the same thread
// by a control dependency nor stores to different addresses, so both steps need a fence: between
// a thread's completed receive and its next send in the same kernel it issues fence.acq_rel at
// the peer scope (fence<peer_scope()>(): .sys on real ranks, .gpu on virtual ranks, memory.h). The
// peer's fence (after its read, before its e+1 send) and the sender's (after it read e+1, before
// its e+2 send) synchronise through the e+1 line, so the peer's read and reset of e happen before
// the e+2 store. The first send of a kernel needs none: the kernel boundary (griddepcontrol.wait
// under PDL) orders the previous call's receives before it.
//
// The fence, as implemented (each buffer on its own):
//   * `received`: set when a recv* of this buffer completes; a send/bcast of this buffer issues
//     fence<peer_scope()>() first if it is set, and clears it. So a fence sits between every
//     receive and the next send of the same buffer, exactly once, and nowhere else (none before
//     the first send of a kernel, none in a one-pass call).
//   * Where credit crosses buffers (a receive on buffer A is what lets a peer write a line that
//     this thread's send on buffer B frees), the kernel calls A.releaseReceives() before B's send:
//     kernels/allreduce_rmsnorm.cu's two-shot does, and LL128 before its adds into the owners'
//     accumulator lines. A.releaseReceivesWith(B) fences once for both buffers (the two-shot
//     AllReduce calls it at the top of every pass: one fence, not one per buffer).
//
// Signature words (sentinel buffers; Proto::kSignatureLine): sentinel lines are pure payload, so
// a peer that made a different call with the same line count would be summed. So every thread's
// channel 0 carries a signature word (protocol_sentinel.h, SentinelSignature): with a line-0 send
// to peer q the thread first stores its call signature (4 bytes, one volatile store, single-copy
// atomic; signatures are odd, never 0) into q's (parity of epoch[0], source = own rank) part at
// layout.h signature_word(block, thread) (the lines of slot kSignatureSlot, which no data channel
// of a sentinel buffer uses: kSlots < kSignatureSlot), then the data. The receive that takes line 0
// from q (recvUnrolled, recvReduce, recvEach, recvGather, a window of them; recv(q, 0)) polls q's
// word for this thread in the same loop as the data and completes only when it equals this call's
// signature; then the thread stores 0 back into the word (resetSignature), as it resets a line. 0
// means "not yet"; any other value is a call mismatch (recorded like an LL one: every rank raises
// CallMismatchError, the signature seen exactly; the receive returns false and the kernel writes
// NaN; the word is left as found).
// Why a word never reads as current at another pass, with no epoch in it: the word is 0 at rest
// (the host zeroes it at construction and at reset()), and it has two writers in turn: the sender's
// store of the signature and the receiver's reset after reading it. The reset is ordered as a
// sentinel line's: after the thread's load of the same address (same-address order), before its
// next send of this buffer by the fence of the credit argument above (or by the kernel boundary).
// The sender stores the word of parity p again (epoch e+2) only with line 0 of e+2, i.e. only with
// that line's credit: after it received this thread's next message (e+1 on this channel, or on the
// paired buffer where credit crosses buffers), which this thread sent after the reset and its
// fence, and after its own fence. So the reset of e happens before the store of e+2, and the poll
// of e+2 (after the reset in program order, same address) sees 0 or that store, never the
// signature of e. (A word the receiver never read, because it gave up, stays set; a fault makes
// every later kernel refuse until reset(), which zeroes it again.) Why this is enough: a thread
// writes outputs only after its receive succeeded, and a peer's word of this pass vouches for every
// line that peer sent in this pass (one kernel launch sends them all; if the peer's call has other
// arguments, its word carries another signature, or it never writes the word of this pass and the
// receive times out). The contract for kernels: a thread that sends a peer any line in a pass sends
// it line 0 too, and a thread's first receive from a peer in a pass takes that peer's line 0 (a
// receive of other lines only polls no word: it must come after the one that took line 0), so every
// word is polled, and reset, exactly once per store. Every thread carries its own words, one per
// peer and pass: no thread's verdict rests on another thread's poll, so the argument above holds
// per thread as written (the protocol model checks exactly this scheme). The words of a warp's
// lanes are adjacent (signature_word: a warp's 32 words are one 128-byte line), so a warp's stores
// of them to one peer, and its polls and resets of them from one peer, are one coalesced access each.
//
// Wide groups (kMaxRanks > kPeerWindow, abi.py PEER_WINDOW): a thread cannot hold every peer's
// polled lines in registers, nor every peer's base: there the buffer keeps CommState's table of
// scratch bases (a peer's base is one cached load; BufferDesc). A receive from every peer
// (recvReduce, recvEach) walks the peers in windows of kPeerWindow (recvReduce: a kernel may take several windows per poll
// set), in rank order: each window's loads are in flight together and complete before the next
// window is polled; recvReduce folds each window into the running rank-order result, so the bits
// are those of the unwindowed sum. bcast stores to every peer back to back, loading the bases a
// window at a time (the first window's before it waits for the data it sends). Each window polls
// its peers' signature words with its lines. A window is a pollAll of its own, and the fence
// rules above hold for every receive.
//
// Memory-ordering contract of each primitive (the orders are spelled in code: memory.h, Proto::store/load):
//   send/bcast   the fence above if `received`, then one 16-byte store per (peer, slot) in the
//                protocol's order (Order::Volatile, Scope::Sys); a sentinel buffer's line-0 send to a
//                peer is preceded by this thread's signature word (volatile, 4 bytes).
//   recv*        polls with 16-byte loads (Proto::load, volatile) until the protocol says the line is
//                complete (LL: both 8-byte words carry the wanted flag); every spin is bounded
//                (fault.h): on timeout, a mismatch or another thread's fault they return false and
//                the kernel must stop. Sentinel lines, and signature words, are reset as soon as
//                their poll has read them (volatile stores after the load of the same address; a
//                mismatching word is left as found). A fault record names the first line still
//                missing (or the wrong one): its slot and epoch. Sets `received`.
//   releaseReceives  the send() fence on its own, if this buffer received since its last fence.
//   advanceEpoch no memory access.
//   commit       plain stores of the epoch counters; the kernel boundary orders them before the
//                next call (which reads them only after griddepcontrol.wait).
#ifndef SOLLAT_LL_BUFFER_H_
#define SOLLAT_LL_BUFFER_H_

#include "sollat/fault.h"
#include "sollat/layout.h"
#include "sollat/protocol_ll.h"
#include "sollat/protocol_sentinel.h"
#include "sollat/impl/ll_buffer__types.h"

namespace sollat {

template <class Proto, int kMaxRanks, int kSlots>
class LLBuffer : public LLBufferBase<kMaxRanks, kSlots> {
 public:
  static constexpr int kPayload = Proto::kPayloadBytes;
  // A wide group (more ranks than kPeerWindow): peers walked in windows of kWin (see "Wide groups").
  static constexpr bool kWide = BufferDesc<kMaxRanks>::kWide;
  static constexpr int kWin = kWide ? kPeerWindow : kMaxRanks;
  static constexpr bool kSig = Proto::kSignatureLine;
  static_assert(!kSig || kSlots < kSignatureSlot, "a sentinel buffer's data channels stay below its signature slot");
  template <typename T> using PackT = Pack<T, kPayload>;
  template <typename T> using AccT = AccPack<T, kPayload>;

  // Loads the epochs of this thread's kSlots channels (slot_i = slot0 + i * kSlotStride). slot0 is
  // slot_index(block, 0, thread): a sentinel buffer's signature word is the (block, thread)'s.
  __device__ LLBuffer(const BufferDesc<kMaxRanks>& desc, const FaultSink& fault, int slot0);

  // Writes line `i` of this thread to `peer` (normally a rank != own). Marks channel i used.
  template <typename T> __device__ void send(int peer, int i, const PackT<T>& v);
  // send() to every peer but self. Returns the pack as every peer receives it (the sentinel
  // protocol canonicalises NaNs on the wire): a rank that uses its own contribution in a result
  // uses this, so every rank's result has the same bits, NaN payloads included.
  template <typename T> __device__ PackT<T> bcast(int i, const PackT<T>& v);

  // Polls peer's line i until complete. Returns false on fault (kernel must stop).
  template <typename T> __device__ bool recv(int peer, int i, PackT<T>& v);
  // Receives lines 0..n-1 (n <= kSlots) from `peer` with all loads in flight together.
  template <typename T> __device__ bool recvUnrolled(int peer, int n, PackT<T> (&v)[kSlots]);
  // Receives lines 0..n-1 from every peer (all (peer, line) loads in flight together) and
  // reduces them with this rank's own values in rank order 0..nranks-1, so every rank computes
  // bitwise the same result. Returns false on fault.
  // In a wide group each poll set covers kWindows windows of kWin peers (their lines must fit the
  // 32-bit pending mask: kWindows * kWin * kSlots <= 32); more windows per set mean fewer round
  // trips in series and more registers, so a kernel opts in where its build has them to spare.
  template <typename T, class Op, int kWindows = 1>
  __device__ bool recvReduce(int n, const PackT<T> (&own)[kSlots], AccT<T> (&out)[kSlots]);

  // Receives lines 0..n-1 from the peers w0 .. w0 + kWin - 1 (all loads in flight together) and
  // hands each to fn(peer, i, pack); the own rank is skipped. Returns false on fault. One window
  // of recvEach (same pollAll: same orders, bounded spin, `received` set and channels 0..n-1
  // marked used even when the window holds no peer).
  template <typename T, class Fn>
  __device__ bool recvWindow(int n, int w0, Fn&& fn);
  // Channel 0's line to `peer`, stored at slot index `slot` of the peer's (parity, source = own
  // rank) part instead of this thread's own slot: for kernels in which the peer's reader of this
  // line is another thread than this one's counterpart (kernels/allreduce_oneshot_wide.cu). The
  // credit rule is the caller's to keep: the reader of that slot must be the thread whose line
  // this thread receives before its next send to `peer` (LL only: no signature words).
  template <typename T> __device__ void sendToSlot(int peer, int slot, const PackT<T>& v);

  // Receives lines 0..n-1 from every peer (all loads in flight together) into got[peer][line];
  // got[own rank] is left untouched. Returns false on fault. Not in a wide group (use recvEach).
  template <typename T>
  __device__ bool recvGather(int n, PackT<T> (&got)[kMaxRanks][kSlots]);
  // Like recvGather, but hands each received line to fn(peer, i, pack) instead of storing it
  // (no second array: fewer registers when the caller writes the data straight out).
  template <typename T, class Fn>
  __device__ bool recvEach(int n, Fn&& fn);

  // The fence a send of this buffer would issue (if it received since its last fence), on its
  // own: for a kernel whose credit crosses buffers, before another buffer's send (see above).
  __device__ void releaseReceives() { beforeSend(); }
  // One fence for this buffer and `other` (if either received since its last fence).
  template <class Other> __device__ void releaseReceivesWith(Other& other);

  // Moves every channel used since the last call to its next epoch (and the other parity).
  __device__ void advanceEpoch();
  // Stores the epochs back to device memory; call once at the end of the kernel (not on fault).
  __device__ void commit();

  // Whether a receive completed since this buffer's last fence (releaseReceivesWith's test).
  __device__ bool owesFence() const { return this->received; }
  __device__ void fenced() { this->received = false; }

 private:
  // Poll results, one set of codes: kPollClean, no line of another call seen; kSigWord, the
  // signature word where a line index is expected (lineAt, mismatch, recvLines); in pollAll's
  // window, data line p * kSlots + i, and peer p's signature word kSigBad + p.
  enum PollCode : int { kPollClean = -2, kSigWord = -1, kSigBad = 32 };
  __device__ long long sendOffset(int i) const;
  __device__ Line* peerLine(int peer, int i) const;
  __device__ Line* ownLine(int src, int i) const;
  __device__ u32* sigWord(Line* line0) const;
  __device__ void sendSignature(Line* line0) const;
  __device__ u32 loadSignature(int src) const;
  __device__ void resetSignature(int src) const;
  __device__ u32 epochOf(int i) const;
  __device__ FaultAt lineAt(int peer, int i) const;
  __device__ FaultAt firstMissing(unsigned pending, unsigned sigPending, int w0) const;
  __device__ void mismatch(int peer, int i) const;
  __device__ void beforeSend();
  template <typename T> __device__ bool recvLines(int peer, int first, int last, PackT<T> (&v)[kSlots]);
  __device__ int windowsEnd() const;
  template <typename T, int kW> __device__ bool pollAll(int n, Line (&lines)[kW][kSlots], int w0);
  template <int kW> __device__ void issuePolls(unsigned pending, Line (&lines)[kW][kSlots], int w0) const;
  template <typename T, int kW>
  __device__ void checkPolls(unsigned& pending, const Line (&lines)[kW][kSlots], int& bad, int w0) const;
};

}  // namespace sollat

#include "sollat/impl/ll_buffer__funcs.h"

#endif  // SOLLAT_LL_BUFFER_H_
