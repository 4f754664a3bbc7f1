// sollat/fault.h - bounded spinning and the device error record.
//
// Every wait in sollat is a `Spin`: it polls, and every kPollsPerCheck polls reads the clock
// and the shared error record. It gives up when the communicator's timeout has passed (the
// first thread to do so records which peer, slot and epoch it waited for) or when another thread
// has already recorded an error (so one missing peer ends the whole kernel quickly). The host
// turns the record into a Python exception naming the peer.
//
// Error record (int32 words, one per communicator, written once by the first failing thread):
//   [0] code    0 = ok, 1 = timeout, 2 = call mismatch (LL flag with the right epoch but another
//               call's signature)
//   [1] rank    the rank that waited        [2] peer   the rank it waited for
//   [3] block   [4] thread                  [5] slot   the line index it polled
//   [6] epoch   the epoch it expected        [7] seen  the signature it saw (mismatch only)
#ifndef SOLLAT_FAULT_H_
#define SOLLAT_FAULT_H_

#include "sollat/memory.h"

namespace sollat {

enum FaultCode : int { kOk = 0, kTimeout = 1, kMismatch = 2 };
constexpr int kFaultWords = 8;
constexpr u32 kPollsPerCheck = 256;

struct FaultSink {
  int* dev;          // device error record (atomicCAS on [0] elects the single writer)
  int* host;         // optional host-mapped copy (plain stores; host reads it without a sync)
  u64 timeout_ns;

  __device__ __forceinline__ bool raised() const { return ld_volatile_u32((const u32*)dev) != 0; }

  __device__ void raise(int code, int rank, int peer, int slot, u32 epoch, u32 seen) const {
    if (atomicCAS(dev, 0, code) != 0) return;  // someone else already reported
    int w[kFaultWords] = {code, rank, peer, (int)blockIdx.x, (int)threadIdx.x, slot, (int)epoch, (int)seen};
    for (int i = 1; i < kFaultWords; ++i) dev[i] = w[i];
    if (host) {
      for (int i = 1; i < kFaultWords; ++i) host[i] = w[i];
      __threadfence_system();  // the details land before the code the host polls
      *(volatile int*)host = code;
    }
  }
};

// One bounded wait. Usage:  Spin s(sink); while (!ready()) if (!s.again(...)) return false;
struct Spin {
  const FaultSink& sink;
  u64 start = 0;
  u32 polls = 0;
  __device__ __forceinline__ explicit Spin(const FaultSink& s) : sink(s) {}

  // Returns false when the wait must stop (timeout recorded, or another thread's error seen).
  __device__ __forceinline__ bool again(int rank, int peer, int slot, u32 epoch) {
    if (++polls % kPollsPerCheck != 0) return true;
    if (sink.raised()) return false;
    u64 now = globaltimer();
    if (start == 0) { start = now; return true; }
    if (now - start > sink.timeout_ns) {
      sink.raise(kTimeout, rank, peer, slot, epoch, 0);
      return false;
    }
    return true;
  }
};

}  // namespace sollat

#endif  // SOLLAT_FAULT_H_
