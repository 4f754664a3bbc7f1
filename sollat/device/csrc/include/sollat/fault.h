// sollat/fault.h - bounded spinning and the fault record every rank sees.
//
// Every wait in sollat is a `Spin`: it polls, and every kPollsPerCheck polls reads the clock
// and the fault record. It gives up when the communicator's timeout has passed (the first thread
// to do so records which peer, slot and epoch it waited for) or when the record already holds a
// fault (so one missing peer ends the whole kernel, on every rank, quickly).
//
// The record lives at the start of every rank's symmetric scratch (sollat/device/abi.py,
// FAULT_RECORD_OFFSET), so a peer can write it. A thread that detects a fault writes it into its
// own record and then into every peer's record: every rank's running kernel gives up at its next
// record check, every later kernel refuses to run (it writes NaN outputs and sends nothing), and
// every rank's host raises the same error. Only reset() (collective) clears the records.
//
// Record words (u32, kFaultWords; sollat/device/abi.py FAULT_RECORD_WORDS; the host decodes them in faults.py):
//   [0] code    0 = ok, 1 = timeout, 2 = call mismatch, kClaimed = a writer is filling [1..7]
//   [1] rank    the rank that detected it     [2] peer   the rank it waited for / disagreed with
//   [3] block   [4] thread                    [5] slot   the line index it polled
//   [6] epoch   the epoch it expected          [7] seen   the signature it saw (mismatch only)
//   [8] collective  the public call the writing kernel serves (abi.h Collective: SOLLAT_COLLECTIVE)
// [5] and [6] name the line that was missing (or wrong): for a wait on several lines, the first
// one still missing; a signature word (a sentinel buffer's, or LL128's reduce-scatter word) is
// named by its line (layout.h signature_word / 4) and the epoch of the channel it travels with.
// Writing a record: CAS [0] from 0 to kClaimed (one writer per record), relaxed stores of the
// details, then a release store of the code, so whoever reads the final code reads the details.
//
// The host-mapped flag (optional, one word in pinned host memory per launch rank) is set by any
// thread of this rank that gives up or refuses; the host polls it without synchronising and
// then reads the device record.
#ifndef SOLLAT_FAULT_H_
#define SOLLAT_FAULT_H_

#include "sollat/abi.h"  // FaultCode, FaultWord, kFaultWords
#include "sollat/memory.h"

#ifndef SOLLAT_COLLECTIVE
#define SOLLAT_COLLECTIVE 0  // kCollUnknown: a build the host did not label
#endif

namespace sollat {

constexpr u32 kPollsPerCheck = 256;
constexpr u32 kThisCollective = SOLLAT_COLLECTIVE;  // the record's collective word (abi.h Collective)

// Writes one record (see above). Returns false when the record already held a fault.
__device__ __forceinline__ bool write_fault_record(u32* rec, const u32 (&w)[kFaultWords]) {
  // Relaxed: the claim only picks one writer; it publishes nothing. System scope: peers write too.
  if (atom_cas<Order::Relaxed, Scope::Sys>(rec, 0u, kClaimed) != 0u) return false;
#pragma unroll
  for (int i = 1; i < kFaultWords; ++i) st<Order::Relaxed, Scope::Sys>(rec + i, w[i]);  // published by the release below
  st<Order::Release, Scope::Sys>(rec, w[0]);  // release: a reader of the code sees the details
  return true;
}

struct FaultSink {
  u32* rec;          // this rank's record (in its own scratch)
  u32* host;         // host-mapped flag, or nullptr
  u64 timeout_ns;
  const u64* peer_scratch;  // every rank's scratch base (the record is at its start), or nullptr
  int nranks;

  // Relaxed: only the code is read here; a stop needs no detail word.
  __device__ __forceinline__ bool raised() const { return ld<Order::Relaxed, Scope::Sys>(rec) != 0u; }

  // Tells this rank's host, without a synchronisation, that the record holds a fault.
  __device__ __forceinline__ void notifyHost() const {
    if (host) signal_host(host);
  }

  // Records a fault here and on every peer (first writer wins on each), then tells the host.
  __device__ void raise(u32 code, int rank, int peer, int slot, u32 epoch, u32 seen) const {
    static_assert(kWordCode == 0 && kWordRank == 1 && kWordPeer == 2 && kWordBlock == 3 && kWordThread == 4 &&
                  kWordSlot == 5 && kWordEpoch == 6 && kWordSeen == 7 && kWordCollective == 8 && kFaultWords == 9,
                  "record word order");
    const u32 w[kFaultWords] = {code, (u32)rank, (u32)peer, blockIdx.x, threadIdx.x, (u32)slot, epoch, seen,
                                kThisCollective};
    if (write_fault_record(rec, w) && peer_scratch) {
      for (int q = 0; q < nranks; ++q) {
        u32* other = (u32*)peer_scratch[q];
        if (other != rec) write_fault_record(other, w);
      }
    }
    notifyHost();
  }
};

// Where a wait was stuck, for its timeout record (computed only when it times out).
struct FaultAt {
  int peer, slot;
  u32 epoch;
};

// One bounded wait. Usage:  Spin s(sink); while (!ready()) if (!s.again(...)) return false;
struct Spin {
  const FaultSink& sink;
  u64 start = 0;
  u32 polls = 0;
  __device__ __forceinline__ explicit Spin(const FaultSink& s) : sink(s) {}

  // Returns false when the wait must stop (timeout recorded, or a fault already recorded here,
  // by this rank or by a peer).
  __device__ __forceinline__ bool again(int rank, int peer, int slot, u32 epoch) {
    return again(rank, [&]() { return FaultAt{peer, slot, epoch}; });
  }
  // The same, with the missing line's place computed by `where()` (a FaultAt) only on timeout:
  // a poll loop then carries no bookkeeping of which line it still waits for.
  template <class Where>
  __device__ __forceinline__ bool again(int rank, Where&& where) {
    if (++polls % kPollsPerCheck != 0) return true;
    if (sink.raised()) {
      sink.notifyHost();
      return false;
    }
    const u64 now = globaltimer();
    if (start == 0) { start = now; return true; }
    // Signed difference: a clock read that goes backwards never looks like a huge wait.
    if ((long long)(now - start) > (long long)sink.timeout_ns) {
      const FaultAt at = where();
      sink.raise(kTimeout, rank, at.peer, at.slot, at.epoch, 0);
      return false;
    }
    return true;
  }
};

}  // namespace sollat

#endif  // SOLLAT_FAULT_H_
