// sollat/impl/ll_buffer__funcs.h - LLBuffer method bodies (contracts in ../ll_buffer.h).
#ifndef SOLLAT_IMPL_LL_BUFFER__FUNCS_H_
#define SOLLAT_IMPL_LL_BUFFER__FUNCS_H_

namespace sollat {

// Rank k's region for a run-time k: a select over the held bases (an indexed access would put
// them in local memory), or in a wide group the table's entry (wide_base).
template <int kMaxRanks>
__device__ __forceinline__ Line* select_base(const BufferDesc<kMaxRanks>& d, int k) {
  if constexpr (!BufferDesc<kMaxRanks>::kHeld) return wide_base(d, k);
  Line* b = d.base[0];
#pragma unroll
  for (int q = 1; q < kMaxRanks; ++q)
    if (q == k) b = d.base[q];
  return b;
}

template <class Proto, int kMaxRanks, int kSlots>
__device__ __forceinline__ LLBuffer<Proto, kMaxRanks, kSlots>::LLBuffer(const BufferDesc<kMaxRanks>& desc,
                                                                         const FaultSink& f, int s0) {
  this->d = desc;
  this->fault = &f;
  this->own = select_base(desc, desc.rank);
  this->slot0 = s0;
  this->used = 0;
  this->received = false;  // the kernel boundary orders the previous call's receives (ll_buffer.h)
#pragma unroll
  for (int i = 0; i < kSlots; ++i) this->epoch[i] = desc.epochs[s0 + i * kSlotStride];  // weak: see commit()
}

template <class Proto, int kMaxRanks, int kSlots>
__device__ __forceinline__ long long LLBuffer<Proto, kMaxRanks, kSlots>::sendOffset(int i) const {
  // (parity, src = self, slot): the same line in every peer's region
  const int parity = this->epoch[i] & 1;
  return line_base(parity, this->d.rank, this->d.nranks, this->d.lines_per_src) + this->slot0 + i * kSlotStride;
}

template <class Proto, int kMaxRanks, int kSlots>
__device__ __forceinline__ Line* LLBuffer<Proto, kMaxRanks, kSlots>::peerLine(int peer, int i) const {
  return select_base(this->d, peer) + sendOffset(i);
}

template <class Proto, int kMaxRanks, int kSlots>
__device__ __forceinline__ Line* LLBuffer<Proto, kMaxRanks, kSlots>::ownLine(int src, int i) const {
  const int parity = this->epoch[i] & 1;
  return this->own + (line_base(parity, src, this->d.nranks, this->d.lines_per_src) + this->slot0 + i * kSlotStride);
}

// ---- signature words (sentinel buffers; ll_buffer.h, "Signature words") ----------------------
// This thread's signature word in a (parity, source) part, given the channel-0 line of the same
// part (the line a send or poll of line 0 addresses anyway, so a word costs one add to that
// address): layout.h signature_word (4-byte words), in the SIGNATURE_SLOT lines of this thread's
// block (no data slot of a sentinel buffer reaches them: kSlots < kSignatureSlot). The part is
// channel 0's parity: the word travels with line 0.
template <class Proto, int kMaxRanks, int kSlots>
__device__ __forceinline__ u32* LLBuffer<Proto, kMaxRanks, kSlots>::sigWord(Line* line0) const {
  const int from_line0 = signature_word(this->slot0 / kSlotsPerBlock, this->slot0 % kMaxThreads) -
                         (int)(sizeof(Line) / sizeof(u32)) * this->slot0;
  return (u32*)line0 + from_line0;
}

// With a line-0 store to a peer (`line0`: that line's address): this thread's signature word, one
// aligned 4-byte volatile store. No order of its own: the peer's reset of the word before this
// store rests on the credit and fence of the channel-0 line it travels with (ll_buffer.h).
template <class Proto, int kMaxRanks, int kSlots>
__device__ __forceinline__ void LLBuffer<Proto, kMaxRanks, kSlots>::sendSignature(Line* line0) const {
  st<Order::Volatile, Scope::Sys>(sigWord(line0), this->d.sig);
}

template <class Proto, int kMaxRanks, int kSlots>
__device__ __forceinline__ u32 LLBuffer<Proto, kMaxRanks, kSlots>::loadSignature(int src) const {
  return ld<Order::Volatile, Scope::Sys>(sigWord(ownLine(src, 0)));  // 4 bytes, single-copy atomic
}

// Source `src`'s word, once this thread's poll has read this call's signature in it: back to empty.
// Volatile, no fence here, as ProtoSentinel::reset: it follows this thread's load of the same
// address (same-address order), and the next send of this buffer fences it (beforeSend).
template <class Proto, int kMaxRanks, int kSlots>
__device__ __forceinline__ void LLBuffer<Proto, kMaxRanks, kSlots>::resetSignature(int src) const {
  st<Order::Volatile, Scope::Sys>(sigWord(ownLine(src, 0)), SentinelSignature::kEmpty);
}

// ---- where a wait is stuck (computed only for a fault record) ---------------------------------
template <class Proto, int kMaxRanks, int kSlots>
__device__ __forceinline__ u32 LLBuffer<Proto, kMaxRanks, kSlots>::epochOf(int i) const {
  u32 e = this->epoch[0];
#pragma unroll
  for (int k = 1; k < kSlots; ++k)  // a select, not an indexed access (which would go to local memory)
    if (k == i) e = this->epoch[k];
  return e;
}

// Line `i` from `peer` (i >= 0), or the signature word from `peer` (i == kSigWord: named by
// the line that holds it, signature_word / 4, and channel 0's epoch).
template <class Proto, int kMaxRanks, int kSlots>
__device__ __forceinline__ FaultAt LLBuffer<Proto, kMaxRanks, kSlots>::lineAt(int peer, int i) const {
  if (kSig && i == kSigWord)
    return FaultAt{peer, signature_word(this->slot0 / kSlotsPerBlock, this->slot0 % kMaxThreads) / 4, this->epoch[0]};
  return FaultAt{peer, this->slot0 + i * kSlotStride, epochOf(i)};
}

// The first line still missing of a pollAll of the window from w0: data (peer order, then line
// order) before signature words.
template <class Proto, int kMaxRanks, int kSlots>
__device__ __forceinline__ FaultAt LLBuffer<Proto, kMaxRanks, kSlots>::firstMissing(unsigned pending,
                                                                                    unsigned sigPending,
                                                                                    int w0) const {
  if (!kSig || pending) {
    const int b = __ffs(pending) - 1;
    return lineAt(w0 + b / kSlots, b % kSlots);
  }
  return lineAt(w0 + __ffs(sigPending) - 1, kSigWord);
}

// Records a call mismatch on line `i` from `peer` (kSigWord: its signature word). The signature
// seen is read again here (the line or word is left as it was found), so the poll loops carry none.
template <class Proto, int kMaxRanks, int kSlots>
__device__ __forceinline__ void LLBuffer<Proto, kMaxRanks, kSlots>::mismatch(int peer, int i) const {
  const FaultAt at = lineAt(peer, i);
  u32 seen;
  if (kSig && i == kSigWord) {
    seen = loadSignature(peer);
  } else {
    const Line* l = this->own + (line_base(at.epoch & 1, peer, this->d.nranks, this->d.lines_per_src) + at.slot);
    seen = Proto::seen(Proto::load(l), this->d.sig, at.epoch);
  }
  this->fault->raise(kMismatch, this->d.rank, at.peer, at.slot, at.epoch, seen);
}

// ---- sends -------------------------------------------------------------------------------------
template <class Proto, int kMaxRanks, int kSlots>
__device__ __forceinline__ void LLBuffer<Proto, kMaxRanks, kSlots>::beforeSend() {
  // A receive completed since the last fence: its loads (and sentinel resets) must be performed
  // before this send, because this send is what lets the peer write those lines again (ll_buffer.h,
  // the credit argument; PTX orders neither by a control dependency).
  if (this->received) {
    fence<peer_scope()>();  // acq_rel at the peer's scope: pairs with the peer's fence after it reads this send
    this->received = false;
  }
}

template <class Proto, int kMaxRanks, int kSlots>
template <class Other>
__device__ __forceinline__ void LLBuffer<Proto, kMaxRanks, kSlots>::releaseReceivesWith(Other& other) {
  if (this->received || other.owesFence()) {
    fence<peer_scope()>();  // one acq_rel fence orders every earlier access of this thread: both buffers' receives
    this->received = false;
    other.fenced();
  }
}

template <class Proto, int kMaxRanks, int kSlots>
template <typename T>
__device__ __forceinline__ void LLBuffer<Proto, kMaxRanks, kSlots>::send(int peer, int i, const PackT<T>& v) {
  beforeSend();
  // The signature word first: it then lands no later than the data the receiver polls with it.
  if (kSig && i == 0) sendSignature(peerLine(peer, 0));
  const Line l = Proto::template encode<T>(v, this->d.sig, this->epoch[i]);
  Proto::store(peerLine(peer, i), l);  // the protocol's order (no fence: see beforeSend)
  this->used |= 1u << i;
}

template <class Proto, int kMaxRanks, int kSlots>
template <typename T>
__device__ __forceinline__ typename LLBuffer<Proto, kMaxRanks, kSlots>::template PackT<T>
LLBuffer<Proto, kMaxRanks, kSlots>::bcast(int i, const PackT<T>& v) {
  // A wide group's first window of peer bases is loaded before anything waits for v, so the
  // table's round trip overlaps the caller's input load instead of following it.
  Line* b[kWide ? kPeerWindow : 1];
  if constexpr (kWide) {
#pragma unroll
    for (int q = 0; q < kPeerWindow; ++q) b[q] = select_base(this->d, q < this->d.nranks ? q : this->d.nranks - 1);
  }
  beforeSend();
  // Encoded and addressed once; then all peers' stores are issued back to back (fire and
  // forget), so they travel concurrently. A channel-0 line's signature word goes to each peer
  // just before its data, so it lands no later than the data it is polled with.
  const Line l = Proto::template encode<T>(v, this->d.sig, this->epoch[i]);
  const long long off = sendOffset(i);
  const bool sig = kSig && i == 0;
  if constexpr (kWide) {
    // Peers in rank order, a window of bases at a time (later windows' bases come from the
    // table lines the first window's loads brought to L1 where they share them: 16 ranks a line).
    for (int w0 = 0;;) {
#pragma unroll
      for (int q = 0; q < kPeerWindow; ++q) {
        const int p = w0 + q;
        if (p < this->d.nranks && p != this->d.rank) {
          if (sig) sendSignature(b[q] + off);
          Proto::store(b[q] + off, l);
        }
      }
      w0 += kPeerWindow;
      if (w0 >= this->d.nranks) break;
#pragma unroll
      for (int q = 0; q < kPeerWindow; ++q) b[q] = select_base(this->d, w0 + q < this->d.nranks ? w0 + q : this->d.nranks - 1);
    }
  } else {
#pragma unroll
    for (int p = 0; p < kMaxRanks; ++p)
      if (p < this->d.nranks && p != this->d.rank) {
        if (sig) sendSignature(this->d.base[p] + off);
        Proto::store(this->d.base[p] + off, l);
      }
  }
  this->used |= 1u << i;
  return Proto::template payload<T>(l);
}

// ---- receives ----------------------------------------------------------------------------------
// Every wait below keeps only bit masks of what is still missing in its loop; a mismatch ends the
// loop and is recorded after it, and a timeout names the first missing line (firstMissing).
template <class Proto, int kMaxRanks, int kSlots>
template <typename T>
__device__ __forceinline__ bool LLBuffer<Proto, kMaxRanks, kSlots>::recv(int peer, int i, PackT<T>& v) {
  PackT<T> got[kSlots];
  if (!recvLines<T>(peer, i, i + 1, got)) return false;
#pragma unroll
  for (int k = 0; k < kSlots; ++k)
    if (k == i) v = got[k];  // a select: i is a run-time index in general
  return true;
}

template <class Proto, int kMaxRanks, int kSlots>
template <typename T>
__device__ __forceinline__ bool LLBuffer<Proto, kMaxRanks, kSlots>::recvUnrolled(int peer, int n,
                                                                                  PackT<T> (&v)[kSlots]) {
  return recvLines<T>(peer, 0, n, v);
}

// Lines first..last-1 from `peer` (recv: one line; recvUnrolled: 0..n-1), every load in flight
// before any is checked; a sentinel buffer whose receive takes line 0 also polls the peer's
// signature word for this thread in the same loop, and resets it with the lines.
template <class Proto, int kMaxRanks, int kSlots>
template <typename T>
__device__ __forceinline__ bool LLBuffer<Proto, kMaxRanks, kSlots>::recvLines(int peer, int first, int last,
                                                                               PackT<T> (&v)[kSlots]) {
  unsigned pending = 0;
#pragma unroll
  for (int i = 0; i < kSlots; ++i)
    if (i >= first && i < last) pending |= 1u << i;
  bool sigWait = kSig && first == 0 && last > 0;
  const bool sigRead = sigWait;
  int bad = kPollClean;  // a line of another call: its index, or kSigWord for the signature word
  Line lines[kSlots];
  Spin spin(*this->fault);
  while (pending || sigWait) {
#pragma unroll
    for (int i = 0; i < kSlots; ++i)  // issue every load before looking at any result
      if (pending & (1u << i)) lines[i] = Proto::load(ownLine(peer, i));  // the protocol's order
    u32 s = SentinelSignature::kEmpty;
    if (sigWait) s = loadSignature(peer);  // with the data polls, checked after them
#pragma unroll
    for (int i = 0; i < kSlots; ++i) {
      if (!(pending & (1u << i))) continue;
      const int r = Proto::template check<T>(lines[i], this->d.sig, this->epoch[i]);
      if (r > 0) pending &= ~(1u << i);
      if (r < 0 && bad == kPollClean) bad = i;
    }
    if (sigWait) {
      const int r = SentinelSignature::check(s, this->d.sig);
      if (r > 0) sigWait = false;
      if (r < 0 && bad == kPollClean) bad = kSigWord;
    }
    if (bad != kPollClean) break;
    if ((pending || sigWait) &&
        !spin.again(this->d.rank, [&]() { return lineAt(peer, pending ? __ffs(pending) - 1 : kSigWord); }))
      return false;
  }
  if (bad != kPollClean) {
    mismatch(peer, bad);
    return false;
  }
#pragma unroll
  for (int i = 0; i < kSlots; ++i)
    if (i >= first && i < last) {
      v[i] = Proto::template payload<T>(lines[i]);
      if (Proto::kNeedsReset) Proto::reset(ownLine(peer, i));  // after the load that read it (same address)
      this->used |= 1u << i;
    }
  if (sigRead) resetSignature(peer);  // after the load that read it (same address), as the lines
  if (last > first) this->received = true;  // the next send fences (it orders these resets too)
  return true;
}

// Issues a poll load for every pending (peer, line) of `lines`.
template <class Proto, int kMaxRanks, int kSlots>
template <int kW>
__device__ __forceinline__ void LLBuffer<Proto, kMaxRanks, kSlots>::issuePolls(unsigned pending,
                                                                              Line (&lines)[kW][kSlots], int w0) const {
#pragma unroll
  for (int p = 0; p < kW; ++p)
#pragma unroll
    for (int i = 0; i < kSlots; ++i)
      if (pending & (1u << (p * kSlots + i))) lines[p][i] = Proto::load(ownLine(w0 + p, i));
}

// Checks every pending line of `lines` (peers w0 + p): clears the bits of complete ones and resets
// those lines (sentinel). A line of another call sets `bad` (p * kSlots + i), once.
template <class Proto, int kMaxRanks, int kSlots>
template <typename T, int kW>
__device__ __forceinline__ void LLBuffer<Proto, kMaxRanks, kSlots>::checkPolls(unsigned& pending,
                                                                              const Line (&lines)[kW][kSlots],
                                                                              int& bad, int w0) const {
#pragma unroll
  for (int p = 0; p < kW; ++p)
#pragma unroll
    for (int i = 0; i < kSlots; ++i) {
      const unsigned bit = 1u << (p * kSlots + i);
      if (!(pending & bit)) continue;
      const int r = Proto::template check<T>(lines[p][i], this->d.sig, this->epoch[i]);
      if (r > 0) {
        pending &= ~bit;
        // Sentinel: clear the line as soon as it is read (same thread, same address: the store
        // is ordered after the load that saw the data), so the resets of early arrivals overlap
        // the wait for later ones instead of all trailing the last arrival.
        Proto::reset(ownLine(w0 + p, i));
      } else if (r < 0 && bad == kPollClean) {
        bad = p * kSlots + i;
      }
    }
}

// Polls lines 0..n-1 of the peers w0 .. w0 + kW - 1 (every peer: w0 = 0 when not wide) until all
// are complete (lines[own rank - w0] untouched); each sentinel line is reset as soon as it is read
// (checkPolls). A sentinel buffer polls, in the same loop, this thread's signature word from
// every peer of the window, and resets each as soon as it reads this call's signature in it.
// Only the polled lines are kept; payloads are extracted by the caller.
// Every bit and `bad` code is relative to w0: a data line p * kSlots + i, the signature word of
// peer p kSigBad + p.
template <class Proto, int kMaxRanks, int kSlots>
template <typename T, int kW>
__device__ __forceinline__ bool LLBuffer<Proto, kMaxRanks, kSlots>::pollAll(int n, Line (&lines)[kW][kSlots],
                                                                             int w0) {
  static_assert(kW * kSlots <= 32, "pending mask is 32 bits");
  unsigned pending = 0, sigPending = 0;
#pragma unroll
  for (int p = 0; p < kW; ++p) {
    if (w0 + p >= this->d.nranks || w0 + p == this->d.rank) continue;
#pragma unroll
    for (int i = 0; i < kSlots; ++i)
      if (i < n) pending |= 1u << (p * kSlots + i);
    if (kSig && n > 0) sigPending |= 1u << p;
  }

  // Every outstanding load is in flight before any is checked. (A second poll set issued half a
  // round trip later, to see arrivals sooner, measured slower at R = 2 and 4, 128 B - 16 KiB:
  // docs/benchmarks.md.)
  int bad = kPollClean;
  Spin spin(*this->fault);
  while (pending | sigPending) {
    issuePolls(pending, lines, w0);
    u32 sw[kW];  // the words with the data polls, checked after them
#pragma unroll
    for (int p = 0; p < kW; ++p)
      if (kSig && (sigPending & (1u << p))) sw[p] = loadSignature(w0 + p);
    checkPolls<T, kW>(pending, lines, bad, w0);
#pragma unroll
    for (int p = 0; p < kW; ++p)
      if (kSig && (sigPending & (1u << p))) {
        const int r = SentinelSignature::check(sw[p], this->d.sig);
        if (r > 0) {
          sigPending &= ~(1u << p);
          resetSignature(w0 + p);  // as checkPolls resets a line: same address, after the load that read it
        }
        if (r < 0 && bad == kPollClean) bad = kSigBad + p;
      }
    if (bad != kPollClean) break;
    if ((pending | sigPending) && !spin.again(this->d.rank, [&]() { return firstMissing(pending, sigPending, w0); }))
      return false;
  }
  if (bad != kPollClean) {
    if (bad >= kSigBad) mismatch(w0 + bad - kSigBad, kSigWord);
    else mismatch(w0 + bad / kSlots, bad % kSlots);
    return false;
  }
  if (n > 0) this->received = true;  // the next send fences (every line and word accepted above was reset)
#pragma unroll
  for (int i = 0; i < kSlots; ++i)
    if (i < n) this->used |= 1u << i;
  return true;
}

// The windows of a receive from every peer: one (w0 = 0, every peer) unless the group is wide,
// then kWin peers at a time in rank order (each window's loads in flight together).
template <class Proto, int kMaxRanks, int kSlots>
__device__ __forceinline__ int LLBuffer<Proto, kMaxRanks, kSlots>::windowsEnd() const {
  return kWide ? this->d.nranks : 1;
}

template <class Proto, int kMaxRanks, int kSlots>
template <typename T, class Fn>
__device__ __forceinline__ bool LLBuffer<Proto, kMaxRanks, kSlots>::recvEach(int n, Fn&& fn) {
  for (int w0 = 0; w0 < windowsEnd(); w0 += kWin)
    if (!recvWindow<T>(n, w0, fn)) return false;
  return true;
}

// One window of recvEach: the peers w0 .. w0 + kWin - 1 (the wide one-shot calls it on its own:
// its threads each poll one peer group).
template <class Proto, int kMaxRanks, int kSlots>
template <typename T, class Fn>
__device__ __forceinline__ bool LLBuffer<Proto, kMaxRanks, kSlots>::recvWindow(int n, int w0, Fn&& fn) {
  Line lines[kWin][kSlots];
  if (!pollAll<T>(n, lines, w0)) return false;
#pragma unroll
  for (int p = 0; p < kWin; ++p)
#pragma unroll
    for (int i = 0; i < kSlots; ++i)
      if (w0 + p < this->d.nranks && w0 + p != this->d.rank && i < n) fn(w0 + p, i, Proto::template payload<T>(lines[p][i]));
  return true;
}

template <class Proto, int kMaxRanks, int kSlots>
template <typename T>
__device__ __forceinline__ void LLBuffer<Proto, kMaxRanks, kSlots>::sendToSlot(int peer, int slot,
                                                                               const PackT<T>& v) {
  static_assert(!kSig, "sendToSlot: a sentinel buffer's signature words travel on the thread's own slot");
  beforeSend();  // the fence of ll_buffer.h's credit argument, as send()
  const Line l = Proto::template encode<T>(v, this->d.sig, this->epoch[0]);
  const long long off = line_base(this->epoch[0] & 1, this->d.rank, this->d.nranks, this->d.lines_per_src) + slot;
  Proto::store(select_base(this->d, peer) + off, l);  // the protocol's order (no fence: see beforeSend)
  this->used |= 1u;
}

template <class Proto, int kMaxRanks, int kSlots>
template <typename T>
__device__ __forceinline__ bool LLBuffer<Proto, kMaxRanks, kSlots>::recvGather(int n,
                                                                                PackT<T> (&got)[kMaxRanks][kSlots]) {
  static_assert(!kWide, "recvGather holds every peer's lines: in a wide group use recvEach");
  return recvEach<T>(n, [&](int p, int i, const PackT<T>& v) { got[p][i] = v; });
}

template <class Proto, int kMaxRanks, int kSlots>
template <typename T, class Op, int kWindows>
__device__ __forceinline__ bool LLBuffer<Proto, kMaxRanks, kSlots>::recvReduce(int n, const PackT<T> (&own)[kSlots],
                                                                                AccT<T> (&out)[kSlots]) {
  constexpr int kReduceWin = kWide ? kWindows * kWin : kWin;  // peers per poll set
  for (int w0 = 0; w0 < windowsEnd(); w0 += kReduceWin) {
    Line lines[kReduceWin][kSlots];
    if (!pollAll<T>(n, lines, w0)) return false;
    // Reduce in rank order 0..nranks-1 (window by window), with the own values in place of the
    // own rank's line. The own/peer choice is made per element (a select on values): choosing a
    // whole pack by a run-time rank makes the compiler index the array dynamically, i.e. put it
    // in local memory.
#pragma unroll
    for (int i = 0; i < kSlots; ++i) {
      if (i >= n) continue;
#pragma unroll
      for (int p = 0; p < kReduceWin; ++p) {
        const int q = w0 + p;
        if (q >= this->d.nranks) continue;
        const bool mine = (q == this->d.rank);
        const PackT<T> theirs = Proto::template payload<T>(lines[p][i]);
        PackT<T> x;
#pragma unroll
        for (int e = 0; e < PackT<T>::kElems; ++e) x.v[e] = mine ? own[i].v[e] : theirs.v[e];
        if (q == 0) pack_to_acc(x, out[i]);
        else acc_reduce<Op>(out[i], x);
      }
    }
  }
  return true;
}

template <class Proto, int kMaxRanks, int kSlots>
__device__ __forceinline__ void LLBuffer<Proto, kMaxRanks, kSlots>::advanceEpoch() {
#pragma unroll
  for (int i = 0; i < kSlots; ++i)
    if (this->used & (1u << i)) this->epoch[i] += 1;
  this->used = 0;
}

template <class Proto, int kMaxRanks, int kSlots>
__device__ __forceinline__ void LLBuffer<Proto, kMaxRanks, kSlots>::commit() {
#pragma unroll
  for (int i = 0; i < kSlots; ++i)  // weak stores: the kernel boundary orders them before the next call's loads
    this->d.epochs[this->slot0 + i * kSlotStride] = this->epoch[i];
}

}  // namespace sollat

#endif  // SOLLAT_IMPL_LL_BUFFER__FUNCS_H_
