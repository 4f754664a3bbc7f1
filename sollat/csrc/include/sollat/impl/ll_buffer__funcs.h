// sollat/impl/ll_buffer__funcs.h - LLBuffer method bodies (contracts in ../ll_buffer.h).
#ifndef SOLLAT_IMPL_LL_BUFFER__FUNCS_H_
#define SOLLAT_IMPL_LL_BUFFER__FUNCS_H_

namespace sollat {

// Selects base[k] for a run-time k without dynamic indexing (which would spill to local memory).
template <int kMaxRanks>
__device__ __forceinline__ Line* select_base(const BufferDesc<kMaxRanks>& d, int k) {
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
  this->resetPending = false;
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

template <class Proto, int kMaxRanks, int kSlots>
__device__ __forceinline__ void LLBuffer<Proto, kMaxRanks, kSlots>::beforeSend() {
  // Sentinel: a reset stored since the last send must land before this send, because this send
  // is what lets the peer write the reset line again (protocol_sentinel.h).
  if (Proto::kNeedsReset && this->resetPending) {
    fence<peer_scope()>();  // acq_rel at the peer's scope: the reset is performed before the send
    this->resetPending = false;
  }
}

template <class Proto, int kMaxRanks, int kSlots>
template <typename T>
__device__ __forceinline__ void LLBuffer<Proto, kMaxRanks, kSlots>::send(int peer, int i, const PackT<T>& v) {
  beforeSend();
  const Line l = Proto::template encode<T>(v, this->d.sig, this->epoch[i]);
  Proto::store(peerLine(peer, i), l);  // the protocol's order (no fence: see beforeSend)
  this->used |= 1u << i;
}

template <class Proto, int kMaxRanks, int kSlots>
template <typename T>
__device__ __forceinline__ typename LLBuffer<Proto, kMaxRanks, kSlots>::template PackT<T>
LLBuffer<Proto, kMaxRanks, kSlots>::bcast(int i, const PackT<T>& v) {
  beforeSend();
  // Encoded and addressed once; then all peers' stores are issued back to back (fire and
  // forget), so they travel concurrently.
  const Line l = Proto::template encode<T>(v, this->d.sig, this->epoch[i]);
  const long long off = sendOffset(i);
#pragma unroll
  for (int p = 0; p < kMaxRanks; ++p)
    if (p < this->d.nranks && p != this->d.rank) Proto::store(this->d.base[p] + off, l);
  this->used |= 1u << i;
  return Proto::template payload<T>(l);
}

template <class Proto, int kMaxRanks, int kSlots>
template <typename T>
__device__ __forceinline__ int LLBuffer<Proto, kMaxRanks, kSlots>::poll(int src, int i, Line& l) {
  u32 seen = 0;
  l = Proto::load(ownLine(src, i));  // the protocol's order; completeness is Proto::check's
  const int r = Proto::template check<T>(l, this->d.sig, this->epoch[i], &seen);
  if (r < 0) this->fault->raise(kMismatch, this->d.rank, src, this->slot0 + i * kSlotStride, this->epoch[i], seen);
  return r;
}

template <class Proto, int kMaxRanks, int kSlots>
template <typename T>
__device__ __forceinline__ bool LLBuffer<Proto, kMaxRanks, kSlots>::recv(int peer, int i, PackT<T>& v) {
  Spin spin(*this->fault);
  Line l;
  for (;;) {
    const int r = poll<T>(peer, i, l);
    if (r > 0) break;
    if (r < 0 || !spin.again(this->d.rank, peer, this->slot0 + i * kSlotStride, this->epoch[i])) return false;
  }
  v = Proto::template payload<T>(l);
  if (Proto::kNeedsReset) {
    Proto::reset(ownLine(peer, i));
    this->resetPending = true;
  }
  this->used |= 1u << i;
  return true;
}

template <class Proto, int kMaxRanks, int kSlots>
template <typename T>
__device__ __forceinline__ bool LLBuffer<Proto, kMaxRanks, kSlots>::recvUnrolled(int peer, int n,
                                                                                  PackT<T> (&v)[kSlots]) {
  unsigned pending = (n >= 32) ? ~0u : ((1u << n) - 1u);
  Line lines[kSlots];
  Spin spin(*this->fault);
  while (pending) {
#pragma unroll
    for (int i = 0; i < kSlots; ++i)  // issue every load before looking at any result
      if (pending & (1u << i)) lines[i] = Proto::load(ownLine(peer, i));
#pragma unroll
    for (int i = 0; i < kSlots; ++i) {
      if (!(pending & (1u << i))) continue;
      u32 seen = 0;
      const int r = Proto::template check<T>(lines[i], this->d.sig, this->epoch[i], &seen);
      if (r > 0) pending &= ~(1u << i);
      if (r < 0) {
        this->fault->raise(kMismatch, this->d.rank, peer, this->slot0 + i * kSlotStride, this->epoch[i], seen);
        return false;
      }
    }
    if (pending && !spin.again(this->d.rank, peer, this->slot0, this->epoch[0])) return false;
  }
#pragma unroll
  for (int i = 0; i < kSlots; ++i)
    if (i < n) {
      v[i] = Proto::template payload<T>(lines[i]);
      if (Proto::kNeedsReset) Proto::reset(ownLine(peer, i));
      this->used |= 1u << i;
    }
  if (Proto::kNeedsReset && n > 0) this->resetPending = true;
  return true;
}

// Issues a poll load for every pending (peer, line) of `lines`.
template <class Proto, int kMaxRanks, int kSlots>
__device__ __forceinline__ void LLBuffer<Proto, kMaxRanks, kSlots>::issuePolls(unsigned pending,
                                                                              Line (&lines)[kMaxRanks][kSlots]) const {
#pragma unroll
  for (int p = 0; p < kMaxRanks; ++p)
#pragma unroll
    for (int i = 0; i < kSlots; ++i)
      if (pending & (1u << (p * kSlots + i))) lines[p][i] = Proto::load(ownLine(p, i));
}

// Checks every pending line of `lines`: clears the bits of complete ones and resets those lines
// (sentinel); records the first peer still missing in *waitPeer. Returns false on a call
// mismatch (recorded in the fault sink).
template <class Proto, int kMaxRanks, int kSlots>
template <typename T>
__device__ __forceinline__ bool LLBuffer<Proto, kMaxRanks, kSlots>::checkPolls(unsigned& pending,
                                                                              const Line (&lines)[kMaxRanks][kSlots],
                                                                              int* waitPeer) const {
#pragma unroll
  for (int p = 0; p < kMaxRanks; ++p)
#pragma unroll
    for (int i = 0; i < kSlots; ++i) {
      const unsigned bit = 1u << (p * kSlots + i);
      if (!(pending & bit)) continue;
      u32 seen = 0;
      const int r = Proto::template check<T>(lines[p][i], this->d.sig, this->epoch[i], &seen);
      if (r > 0) {
        pending &= ~bit;
        // Sentinel: clear the line as soon as it is read (same thread, same address: the store
        // is ordered after the load that saw the data), so the resets of early arrivals overlap
        // the wait for later ones instead of all trailing the last arrival.
        Proto::reset(ownLine(p, i));
      } else if (r < 0) {
        this->fault->raise(kMismatch, this->d.rank, p, this->slot0 + i * kSlotStride, this->epoch[i], seen);
        return false;
      } else if (*waitPeer < 0) {
        *waitPeer = p;
      }
    }
  return true;
}

// Polls lines 0..n-1 of every peer until all are complete (lines[own rank] untouched); each
// sentinel line is reset as soon as it is read (checkPolls). Only the polled lines are kept;
// payloads are extracted by the caller.
template <class Proto, int kMaxRanks, int kSlots>
template <typename T>
__device__ __forceinline__ bool LLBuffer<Proto, kMaxRanks, kSlots>::pollAll(int n, Line (&lines)[kMaxRanks][kSlots]) {
  static_assert(kMaxRanks * kSlots <= 32, "pending mask is 32 bits");
  unsigned pending = 0;
#pragma unroll
  for (int p = 0; p < kMaxRanks; ++p)
#pragma unroll
    for (int i = 0; i < kSlots; ++i)
      if (p < this->d.nranks && p != this->d.rank && i < n) pending |= 1u << (p * kSlots + i);

  // Every outstanding load is in flight before any is checked. (A second poll set issued half a
  // round trip later, to see arrivals sooner, measured 0.03-0.36 us slower at R = 2 and 4,
  // 128 B - 16 KiB: docs/benchmarks.md run 12.)
  Spin spin(*this->fault);
  while (pending) {
    issuePolls(pending, lines);
    int waitPeer = -1;
    if (!checkPolls<T>(pending, lines, &waitPeer)) return false;
    if (pending && !spin.again(this->d.rank, waitPeer, this->slot0, this->epoch[0])) return false;
  }

  if (Proto::kNeedsReset && n > 0) this->resetPending = true;  // checkPolls cleared every line it accepted
#pragma unroll
  for (int i = 0; i < kSlots; ++i)
    if (i < n) this->used |= 1u << i;
  return true;
}

template <class Proto, int kMaxRanks, int kSlots>
template <typename T, class Fn>
__device__ __forceinline__ bool LLBuffer<Proto, kMaxRanks, kSlots>::recvEach(int n, Fn&& fn) {
  Line lines[kMaxRanks][kSlots];
  if (!pollAll<T>(n, lines)) return false;
#pragma unroll
  for (int p = 0; p < kMaxRanks; ++p)
#pragma unroll
    for (int i = 0; i < kSlots; ++i)
      if (p < this->d.nranks && p != this->d.rank && i < n) fn(p, i, Proto::template payload<T>(lines[p][i]));
  return true;
}

template <class Proto, int kMaxRanks, int kSlots>
template <typename T>
__device__ __forceinline__ bool LLBuffer<Proto, kMaxRanks, kSlots>::recvGather(int n,
                                                                                PackT<T> (&got)[kMaxRanks][kSlots]) {
  return recvEach<T>(n, [&](int p, int i, const PackT<T>& v) { got[p][i] = v; });
}

template <class Proto, int kMaxRanks, int kSlots>
template <typename T, class Op>
__device__ __forceinline__ bool LLBuffer<Proto, kMaxRanks, kSlots>::recvReduce(int n, const PackT<T> (&own)[kSlots],
                                                                                AccT<T> (&out)[kSlots]) {
  Line lines[kMaxRanks][kSlots];
  if (!pollAll<T>(n, lines)) return false;
  // Reduce in rank order 0..nranks-1, with the own values in place of the own rank's line.
  // The own/peer choice is made per element (a select on values): choosing a whole pack by a
  // run-time rank makes the compiler index the array dynamically, i.e. put it in local memory.
#pragma unroll
  for (int i = 0; i < kSlots; ++i) {
    if (i >= n) continue;
#pragma unroll
    for (int p = 0; p < kMaxRanks; ++p) {
      if (p >= this->d.nranks) continue;
      const bool mine = (p == this->d.rank);
      const PackT<T> theirs = Proto::template payload<T>(lines[p][i]);
      PackT<T> x;
#pragma unroll
      for (int e = 0; e < PackT<T>::kElems; ++e) x.v[e] = mine ? own[i].v[e] : theirs.v[e];
      if (p == 0) pack_to_acc(x, out[i]);
      else acc_reduce<Op>(out[i], x);
    }
  }
  return true;
}

template <class Proto, int kMaxRanks, int kSlots>
__device__ __forceinline__ void LLBuffer<Proto, kMaxRanks, kSlots>::reset(int peer, int i) {
  if (!Proto::kNeedsReset) return;
  Proto::reset(ownLine(peer, i));
  this->resetPending = true;
}

template <class Proto, int kMaxRanks, int kSlots>
__device__ __forceinline__ void LLBuffer<Proto, kMaxRanks, kSlots>::resetRange(int peer, int first, int count) {
#pragma unroll
  for (int i = 0; i < kSlots; ++i)
    if (i >= first && i < first + count) reset(peer, i);
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
