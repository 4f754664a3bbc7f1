"""GPU sanity of the built-in AllGather / ReduceScatter on virtual ranks (bitwise vs the references)."""
import sys, time, torch, sollat
from sollat import gather_scatter as gs
dev = torch.device("cuda", 0)
t0 = time.time(); ok = bad = 0
for r in (2, 4, 8):
    c = sollat.VirtualCommunicator(r, dev, timeout_s=5.0)
    gen = torch.Generator(device=dev).manual_seed(r)
    for dt in (torch.float32, torch.bfloat16):
        for n in (1, 7, 1000, 65537):
            for algo in ("ll", "sentinel", "auto"):
                xs = [torch.randn(n, generator=gen, device=dev).to(dt) for _ in range(r)]
                ys = c.all_gather(xs, algo=algo)
                want = gs.all_gather_reference(xs)
                for y in ys:
                    if torch.equal(y.view(torch.int16 if dt != torch.float32 else torch.int32), want.view(torch.int16 if dt != torch.float32 else torch.int32)): ok += 1
                    else: bad += 1; print("AG BAD", r, dt, n, algo)
                xr = [torch.randn(n * r, generator=gen, device=dev).to(dt) for _ in range(r)]
                ys = c.reduce_scatter(xr, algo=algo)
                want = gs.reduce_scatter_reference(xr, "sum")
                for y, w in zip(ys, want):
                    if torch.equal(y, w.to(y.device)): ok += 1
                    else: bad += 1; print("RS BAD", r, dt, n, algo, (y.float() - w.to(y.device).float()).abs().max().item())
    c.check()
print(f"gather/scatter sanity: {ok} ok, {bad} bad, {time.time() - t0:.1f} s")
