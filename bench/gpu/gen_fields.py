"""Generate the 512 MiB f32 benchmark fields on the GPU machine (PyTorch, CUDA).

  python3 gen_fields.py OUTDIR

grf.f32        512^3 Gaussian random field, power spectrum k^(-11/3) (amplitude k^(-11/6)), unit std
grf_thr.f32    the same field with values below the 84th percentile set to 0 (~84 % zeros)
uniform.f32    uniform noise in [0, 1)
resnet50.f32   ResNet-50 parameter gradients (torchvision, random init, random 32x3x224x224 batches,
               cross-entropy on random labels), consecutive backward passes concatenated, 2^27 values
"""
import os, sys, time
import torch

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
dev = "cuda"
n = 512
g = torch.Generator(device=dev).manual_seed(20261122)
t0 = time.time()
white = torch.randn((n, n, n), generator=g, device=dev, dtype=torch.float32)
f = torch.fft.rfftn(white)
del white
k1 = torch.fft.fftfreq(n, device=dev) * n
k2 = torch.fft.rfftfreq(n, device=dev) * n
kk = (k1[:, None, None] ** 2 + k1[None, :, None] ** 2 + k2[None, None, :] ** 2).sqrt()
amp = torch.where(kk > 0, kk.clamp(min=1e-12) ** (-11.0 / 6.0), torch.zeros_like(kk))
del kk
f *= amp
del amp
x = torch.fft.irfftn(f, s=(n, n, n))
del f
x = (x - x.mean()) / x.std()
x = x.contiguous()
x.cpu().numpy().tofile(os.path.join(out, "grf.f32"))
t = torch.quantile(x.flatten()[:: 64].float(), 0.84).item()
xt = torch.where(x > t, x, torch.zeros_like(x))
print(f"grf: std {x.std().item():.3f}, threshold {t:.4f}, zeros {(xt == 0).float().mean().item():.4f}", flush=True)
xt.cpu().numpy().tofile(os.path.join(out, "grf_thr.f32"))
del x, xt
u = torch.rand(n ** 3, generator=g, device=dev, dtype=torch.float32)
u.cpu().numpy().tofile(os.path.join(out, "uniform.f32"))
del u
torch.cuda.empty_cache()
try:
    import torchvision
    torch.manual_seed(20261122)
    m = torchvision.models.resnet50(weights=None).to(dev)
    lossf = torch.nn.CrossEntropyLoss()
    grads, total = [], 0
    while total < n ** 3:
        m.zero_grad(set_to_none=True)
        xb = torch.randn(32, 3, 224, 224, device=dev)
        yb = torch.randint(0, 1000, (32,), device=dev)
        lossf(m(xb), yb).backward()
        gv = torch.cat([p.grad.flatten() for p in m.parameters() if p.grad is not None]).float()
        grads.append(gv.cpu())
        total += gv.numel()
    gr = torch.cat(grads)[: n ** 3].contiguous()
    gr.numpy().tofile(os.path.join(out, "resnet50.f32"))
    print(f"resnet50: {len(grads)} backward passes, {gr.numel()} values", flush=True)
except Exception as e:  # torchvision missing: no ResNet-50 input
    print(f"resnet50 gradient skipped: {e}", flush=True)
print(f"generated in {time.time() - t0:.1f} s", flush=True)
