"""The speed-of-light probe (``python -m sollat sol``).

    SoL = 2 x L2 round trip + remote store                      (docs/measurement.md)

* L2 round trip: the latency of one ``__threadfence()`` (``fence.sc.gpu``), a dependent chain
  on one thread timed with %globaltimer. A dependent ``ld.volatile`` pointer chase over
  L2-resident lines is measured beside it as a cross-check.
* Remote store: half the round trip of a flag ping-pong. Between two GPUs when this process
  sees two (each side stores into the other GPU's memory and polls its own), otherwise between
  two SMs of one GPU; the output says which.

Each figure is the median over ``repeats`` launches (one more, untimed, warms up), with min,
max and p10-p90 spread. ``REFERENCE_NS`` holds the figures of one H200, measured by a standalone
probe outside this package, for comparison: fence 135 ns, SM-to-SM ping-pong 543 ns round trip,
pointer chase 155 ns.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .stats import Stats

REFERENCE_NS = {"fence": 135.0, "pingpong_rtt_sm": 543.0, "chase": 155.0}
SOURCE = "probe_sol.cu"
FENCE_MODES = {"fence": (0, "fence.sc.gpu (= __threadfence)"),
               "fence_acq_rel": (1, "fence.acq_rel.gpu"),
               "fence_sys": (2, "fence.sc.sys (= __threadfence_system)")}


def _component(name: str, method: str, ns: list[float], cycles: list[float], **extra: Any) -> dict[str, Any]:
    s = Stats.of(ns)
    c = Stats.of(cycles)
    d: dict[str, Any] = {
        "name": name, "method": method, "status": "ok",
        "median_ns": s.median, "min_ns": s.min, "max_ns": s.max, "p10_ns": s.p10, "p90_ns": s.p90,
        "spread_pct": s.spread_pct, "n": s.n, "cycles": c.median, "samples_ns": ns,
    }
    d.update(extra)
    return d


def _failed(name: str, reason: str) -> dict[str, Any]:
    return {"name": name, "status": "error", "reason": reason}


class _Probe:
    def __init__(self, device_index: int, timeout_s: float) -> None:
        import torch

        from ..device.build import get_kernel
        from ..device.launch import ensure_device

        self.torch = torch
        self.index = device_index
        self.device = torch.device("cuda", device_index)
        torch.cuda.set_device(self.device)
        ensure_device(device_index)
        self.k_fence = get_kernel(SOURCE, "sollat_probe_fence")
        self.k_chase = get_kernel(SOURCE, "sollat_probe_chase")
        self.k_ping = get_kernel(SOURCE, "sollat_probe_pingpong")
        self.timeout_ns = np.uint64(int(timeout_s * 1e9))

    def _launch(self, kernel: Any, grid: tuple[int, int], args: tuple[Any, ...], device_index: int | None = None) -> None:
        from ..device.launch import launch, launch_config

        idx = self.index if device_index is None else device_index
        if idx != self.index:
            from cuda.core import Device

            Device(idx).set_current()
        try:
            launch(kernel, launch_config(grid, 32, pdl=False), args, device=self.torch.device("cuda", idx))
        finally:
            if idx != self.index:
                from cuda.core import Device

                Device(self.index).set_current()

    def fence(self, mode: int, iters: int, repeats: int) -> tuple[list[float], list[float]]:
        torch = self.torch
        iters = max(8, iters // 8 * 8)
        out = torch.zeros(8, dtype=torch.int64, device=self.device)
        ns, cyc = [], []
        for rep in range(repeats + 1):
            self._launch(self.k_fence, (1, 1), (out.data_ptr(), np.int32(iters), np.int32(mode)))
            torch.cuda.synchronize(self.device)
            vals = out.tolist()
            if rep > 0:
                ns.append(vals[0] / iters)
                cyc.append(vals[1] / iters)
        return ns, cyc

    def chase(self, iters: int, repeats: int, region_bytes: int = 2 << 20) -> tuple[list[float], list[float]]:
        torch = self.torch
        lines = region_bytes // 128
        stride = 128 // 4
        perm = torch.randperm(lines, generator=torch.Generator().manual_seed(1234))
        perm = perm[perm != 0]
        order = torch.cat([torch.zeros(1, dtype=perm.dtype), perm])  # one cycle through every line, from 0
        nxt = torch.zeros(lines * stride, dtype=torch.int32)
        nxt[order * stride] = (torch.roll(order, -1) * stride).to(torch.int32)
        nxt = nxt.to(self.device)
        out = torch.zeros(8, dtype=torch.int64, device=self.device)
        sink = torch.zeros(4, dtype=torch.int32, device=self.device)
        iters = max(8, iters // 8 * 8)
        warm = max(8, (lines + 7) // 8 * 8)
        ns, cyc = [], []
        # the first launch walks the whole cycle once: every line is in L2 afterwards
        self._launch(self.k_chase, (1, 1), (nxt.data_ptr(), np.int32(warm), out.data_ptr(), sink.data_ptr()))
        for _ in range(repeats):
            self._launch(self.k_chase, (1, 1), (nxt.data_ptr(), np.int32(iters), out.data_ptr(), sink.data_ptr()))
            torch.cuda.synchronize(self.device)
            vals = out.tolist()
            ns.append(vals[0] / iters)
            cyc.append(vals[1] / iters)
        return ns, cyc

    def _check_fault(self, fault: Any, what: str) -> None:
        f = fault.tolist()
        if f[0] != 0:
            raise RuntimeError(f"{what}: role {f[1]} timed out waiting for role {f[2]} at round {f[6]} "
                               f"(fault code {f[0]}); the other side never answered")

    def pingpong_sm(self, iters: int, warm: int, repeats: int) -> tuple[list[float], list[float], list[int]]:
        torch = self.torch
        inbox = torch.zeros(64, dtype=torch.int32, device=self.device)  # inbox0 at +0, inbox1 at +128 B
        out = torch.zeros(8, dtype=torch.int64, device=self.device)
        fault = torch.zeros(8, dtype=torch.int32, device=self.device)
        ns, cyc, sms = [], [], []
        for rep in range(repeats + 1):
            inbox.zero_()
            self._launch(self.k_ping, (2, 1), (inbox.data_ptr(), inbox.data_ptr() + 128, np.int32(0), np.int32(iters),
                                               np.int32(warm), out.data_ptr(), fault.data_ptr(), self.timeout_ns))
            torch.cuda.synchronize(self.device)
            self._check_fault(fault, "SM-to-SM ping-pong")
            vals = out.tolist()
            if rep > 0:
                ns.append(vals[0] / iters)
                cyc.append(vals[1] / iters)
                sms = [int(vals[3]), int(vals[4])]
        return ns, cyc, sms

    def pingpong_gpus(self, peer: int, iters: int, warm: int, repeats: int) -> tuple[list[float], list[float]]:
        torch = self.torch
        a, b = self.index, peer
        inbox_a = torch.zeros(32, dtype=torch.int32, device=torch.device("cuda", a))
        inbox_b = torch.zeros(32, dtype=torch.int32, device=torch.device("cuda", b))
        out_a = torch.zeros(8, dtype=torch.int64, device=inbox_a.device)
        out_b = torch.zeros(8, dtype=torch.int64, device=inbox_b.device)
        fault_a = torch.zeros(8, dtype=torch.int32, device=inbox_a.device)
        fault_b = torch.zeros(8, dtype=torch.int32, device=inbox_b.device)
        ns, cyc = [], []
        for rep in range(repeats + 1):
            inbox_a.zero_()
            inbox_b.zero_()
            torch.cuda.synchronize(a)
            torch.cuda.synchronize(b)
            common = (inbox_a.data_ptr(), inbox_b.data_ptr())
            # the responder first, so it is polling when the first store lands
            with torch.cuda.device(b):
                self._launch(self.k_ping, (1, 1), (*common, np.int32(1), np.int32(iters), np.int32(warm),
                                                   out_b.data_ptr(), fault_b.data_ptr(), self.timeout_ns), b)
            self._launch(self.k_ping, (1, 1), (*common, np.int32(0), np.int32(iters), np.int32(warm),
                                               out_a.data_ptr(), fault_a.data_ptr(), self.timeout_ns), a)
            torch.cuda.synchronize(a)
            torch.cuda.synchronize(b)
            self._check_fault(fault_a, f"GPU{a}<->GPU{b} ping-pong")
            self._check_fault(fault_b, f"GPU{a}<->GPU{b} ping-pong")
            vals = out_a.tolist()
            if rep > 0:
                ns.append(vals[0] / iters)
                cyc.append(vals[1] / iters)
        return ns, cyc


def enable_peer_access(a: int, b: int) -> str | None:
    """Enable a<->b peer access for the current process; returns None or why it is not possible."""
    import torch

    if not torch.cuda.can_device_access_peer(a, b) or not torch.cuda.can_device_access_peer(b, a):
        return f"GPU{a} and GPU{b} cannot access each other's memory (no P2P)"
    try:
        from cuda.bindings import runtime as rt
    except Exception as exc:  # pragma: no cover - cuda.bindings is a dependency
        return f"cuda.bindings.runtime unavailable: {exc}"
    for x, y in ((a, b), (b, a)):
        with torch.cuda.device(x):
            (err,) = rt.cudaDeviceEnablePeerAccess(y, 0)
            if err not in (rt.cudaError_t.cudaSuccess, rt.cudaError_t.cudaErrorPeerAccessAlreadyEnabled):
                return f"cudaDeviceEnablePeerAccess({x}->{y}) failed: {err}"
            rt.cudaGetLastError()  # clear "already enabled"
    return None


def run_sol(device_index: int = 0, *, repeats: int = 9, fence_iters: int = 4096, chase_iters: int = 4096,
            ping_iters: int = 2000, ping_warm: int = 50, timeout_s: float = 5.0, peer: int | None = None,
            single_gpu: bool = False, progress: Any = None) -> dict[str, Any]:
    """Measure the SoL components on ``device_index`` (and ``peer`` for the GPU-to-GPU ping-pong)."""
    import torch

    probe = _Probe(device_index, timeout_s)
    res: dict[str, Any] = {"card": torch.cuda.get_device_name(device_index), "device": device_index,
                           "repeats": repeats, "notes": []}

    def step(note: str) -> None:
        if progress is not None:
            progress.advance(note=note)

    for key, (mode, name) in FENCE_MODES.items():
        try:
            ns, cyc = probe.fence(mode, fence_iters, repeats)
            res[key] = _component(name, f"one thread, {fence_iters} dependent fences unrolled x8, %globaltimer",
                                  ns, cyc)
        except Exception as exc:
            res[key] = _failed(name, f"{type(exc).__name__}: {exc}")
        step(name)
    try:
        ns, cyc = probe.chase(chase_iters, repeats)
        res["chase"] = _component("ld.volatile chase (L2 hit)",
                                  f"one thread, {chase_iters} dependent 4-byte loads over 2 MiB of distinct "
                                  "128-byte lines, warmed, %globaltimer", ns, cyc)
    except Exception as exc:
        res["chase"] = _failed("ld.volatile chase (L2 hit)", f"{type(exc).__name__}: {exc}")
    step("chase")

    count = torch.cuda.device_count()
    other = peer if peer is not None else (device_index + 1) % count
    why_not = None
    if single_gpu:
        why_not = "the one-GPU figure was asked for"
    elif count < 2:
        why_not = "only one GPU is visible"
    else:
        why_not = enable_peer_access(device_index, other)
    try:
        if why_not is None:
            ns, cyc = probe.pingpong_gpus(other, ping_iters, ping_warm, repeats)
            kind = f"GPU{device_index} <-> GPU{other} ping-pong"
            res["remote_kind"] = f"a ping-pong between GPU{device_index} and GPU{other}"
            ref = None
            method = ("one thread per GPU: st.volatile of a counter into the peer GPU's memory, bounded "
                      f"ld.volatile poll of the own; {ping_iters} rounds after {ping_warm} warm-up rounds")
        else:
            ns, cyc, sms = probe.pingpong_sm(ping_iters, ping_warm, repeats)
            kind = "SM-to-SM ping-pong (one GPU)"
            res["remote_kind"] = f"a ping-pong between two SMs of one GPU ({why_not}): SMs {sms[0]} and {sms[1]}"
            ref = REFERENCE_NS["pingpong_rtt_sm"]
            method = (f"two blocks of one thread on SMs {sms[0]} and {sms[1]}: st.volatile of a counter into the "
                      f"other's inbox, bounded ld.volatile poll of the own; {ping_iters} rounds after {ping_warm} "
                      "warm-up rounds")
            if sms[0] == sms[1]:
                res["notes"].append("both ping-pong blocks ran on the same SM: the figure is not SM-to-SM")
        res["pingpong"] = _component(f"{kind}, round trip", method, ns, cyc, reference_rtt_ns=ref)
    except Exception as exc:
        res["pingpong"] = _failed("ping-pong", f"{type(exc).__name__}: {exc}")
        res["remote_kind"] = "nothing (the ping-pong failed)"
    step("ping-pong")

    fence = res.get("fence", {})
    ping = res.get("pingpong", {})
    if fence.get("status") == "ok" and ping.get("status") == "ok":
        res["l2_rtt_ns"] = fence["median_ns"]
        res["remote_store_ns"] = ping["median_ns"] / 2.0
        res["sol_ns"] = 2.0 * res["l2_rtt_ns"] + res["remote_store_ns"]
        if res.get("chase", {}).get("status") == "ok":
            alt = 2.0 * res["chase"]["median_ns"] + res["remote_store_ns"]
            res["notes"].append(f"with the load chase as the L2 round trip instead: SoL = {alt:.1f} ns")
        ghz = fence["cycles"] / fence["median_ns"] if fence["median_ns"] else 0.0
        res["sm_clock_ghz"] = ghz
    else:
        res["l2_rtt_ns"] = res["remote_store_ns"] = res["sol_ns"] = None
    res["reference"] = reference_check(res)
    return res


def reference_check(res: dict[str, Any]) -> dict[str, Any]:
    """Measured / reference for the figures the H200 reference has; ``within_2x`` per figure."""
    out: dict[str, Any] = {}
    pairs = [("fence", res.get("fence", {}), REFERENCE_NS["fence"]),
             ("chase", res.get("chase", {}), REFERENCE_NS["chase"])]
    ping = res.get("pingpong", {})
    if ping.get("reference_rtt_ns"):
        pairs.append(("pingpong_rtt_sm", ping, REFERENCE_NS["pingpong_rtt_sm"]))
    for key, comp, ref in pairs:
        if comp.get("status") == "ok":
            ratio = comp["median_ns"] / ref
            out[key] = {"measured_ns": comp["median_ns"], "reference_ns": ref, "ratio": ratio,
                        "within_2x": 0.5 <= ratio <= 2.0}
    return out


def sol_failures(res: dict[str, Any]) -> list[str]:
    """``"name: reason"`` of every component of a ``run_sol`` result that failed."""
    return [f"{comp.get('name', key)}: {comp.get('reason', 'no reason given')}"
            for key, comp in res.items() if isinstance(comp, dict) and comp.get("status") == "error"]


def sol_us(sol: dict[str, Any] | None) -> float | None:
    if not sol or sol.get("sol_ns") is None:
        return None
    return float(sol["sol_ns"]) / 1000.0
