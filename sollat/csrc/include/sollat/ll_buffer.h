// sollat/ll_buffer.h - the low-latency buffer: sollat's device API for barrier-free collectives.
//
// An LLBuffer is one thread's view of a region of symmetric scratch memory, in LL or sentinel
// mode (the Proto template parameter: ProtoLL from protocol_ll.h, ProtoSentinel from
// protocol_sentinel.h). It mirrors the paper's ncclLLBuffer: thread-level send, recv,
// recvUnrolled, recvReduce, bcast, reset, resetRange and advanceEpoch. Collectives are written
// with it; see kernels/allreduce_oneshot.cu for a complete example.
//
// Line-channels and epochs (the rules, shared with sollat/layout.py and the protocol model):
//   * A thread owns kSlots line-channels: slot indices  s_i = (block * MAX_SLOTS + i) * MAX_THREADS
//     + threadIdx.x,  i < kSlots. Channel s on rank r talks only to channel s on every peer.
//   * Every channel has its own epoch counter per rank (in device memory, so CUDA graphs replay
//     correctly). The constructor loads it, commit() stores it. advanceEpoch() increments the
//     counters of the channels used since the last advance; unused channels keep theirs. Since
//     every rank runs the same calls cut the same way, counters agree across ranks.
//   * Double buffering: a line exists in two parities (epoch & 1). The sender writes parity
//     e & 1 into the receiver's region at [parity][source = sender][slot].
//
// Why reuse is safe without a barrier (the credit argument): a sender writes a channel's line of
// parity p at epoch e+2 only after it received epoch e+1 on that channel from the same peer
// (recv/recvReduce of e+1 precedes send of e+2 in the thread's program order, and the send is
// control-dependent on the poll that saw the data, so it cannot become visible earlier). The peer
// sent e+1 only after it finished reading (and, in sentinel mode, resetting) epoch e. So the line
// is free when it is written again. Stores to a peer are never speculative on NVIDIA GPUs; this is
// the same reasoning NCCL's LL protocol rests on.
//
// Memory-ordering contract of each primitive (the orders are spelled in code: memory.h, Proto::store/load):
//   send/bcast   one 16-byte store per (peer, slot) in the protocol's order (Order::Volatile,
//                Scope::Sys), no fence. In sentinel mode, if this thread reset a line since its last
//                send, fence<peer_scope()>() (acq_rel) is issued first so the reset lands before the
//                peer can be told to write that line again.
//   recv*        polls with 16-byte loads (Proto::load, volatile) until the protocol says the line is complete;
//                every spin is bounded (fault.h): on timeout or another thread's fault they
//                return false and the kernel must stop. recvReduce/recvGather reset each sentinel
//                line as soon as its poll has read it (store after load, same thread and address).
//   releaseResets sentinel: the send() fence on its own (acq_rel at peer scope) if this buffer
//                reset lines since its last send; LL: no-op.
//   reset        sentinel: store all-ones into this rank's own line (ordering as for send); LL: no-op.
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
  template <typename T> using PackT = Pack<T, kPayload>;
  template <typename T> using AccT = AccPack<T, kPayload>;

  // Loads the epochs of this thread's kSlots channels (slot_i = slot0 + i * kSlotStride).
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
  template <typename T, class Op>
  __device__ bool recvReduce(int n, const PackT<T> (&own)[kSlots], AccT<T> (&out)[kSlots]);

  // Receives lines 0..n-1 from every peer (all loads in flight together) into got[peer][line];
  // got[own rank] is left untouched. Returns false on fault.
  template <typename T>
  __device__ bool recvGather(int n, PackT<T> (&got)[kMaxRanks][kSlots]);
  // Like recvGather, but hands each received line to fn(peer, i, pack) instead of storing it
  // (no second array: fewer registers when the caller writes the data straight out).
  template <typename T, class Fn>
  __device__ bool recvEach(int n, Fn&& fn);

  // Sentinel: marks this rank's line i from `peer` empty again (recv* already does this for what
  // it consumed). LL: no-op. resetRange does lines first..first+count-1.
  __device__ void reset(int peer, int i);
  __device__ void resetRange(int peer, int first, int count);
  // Sentinel: the resets this buffer stored since its last send land before any later store of
  // this thread (the fence send() would issue), for a kernel whose credit crosses buffers: there
  // the store that frees these lines for the peer is another buffer's send
  // (kernels/allreduce_rmsnorm.cu, two-shot). LL, or nothing reset: no-op.
  __device__ void releaseResets() { beforeSend(); }

  // Moves every channel used since the last call to its next epoch (and the other parity).
  __device__ void advanceEpoch();
  // Stores the epochs back to device memory; call once at the end of the kernel (not on fault).
  __device__ void commit();

 private:
  __device__ long long sendOffset(int i) const;
  __device__ Line* peerLine(int peer, int i) const;
  __device__ Line* ownLine(int src, int i) const;
  __device__ void beforeSend();
  template <typename T> __device__ int poll(int src, int i, Line& l);
  template <typename T> __device__ bool pollAll(int n, Line (&lines)[kMaxRanks][kSlots]);
  __device__ void issuePolls(unsigned pending, Line (&lines)[kMaxRanks][kSlots]) const;
  template <typename T>
  __device__ bool checkPolls(unsigned& pending, const Line (&lines)[kMaxRanks][kSlots], int* waitPeer) const;
};

}  // namespace sollat

#include "sollat/impl/ll_buffer__funcs.h"

#endif  // SOLLAT_LL_BUFFER_H_
