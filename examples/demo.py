"""A short tour of the openreg device: `python examples/demo.py`."""

import torch  # loads torch_openreg through the torch.backends entry point

print(f"openreg devices: {torch.openreg.device_count()}, current: openreg:{torch.openreg.current_device()}")

torch.manual_seed(0)
x = torch.randn(3, device="openreg")
print("torch.randn(3, device='openreg') ->", x)

a = torch.arange(6.0).reshape(2, 3).to("openreg")
print("a @ a.T ->", (a @ a.T).cpu().tolist())
print("a.sum(dim=1) ->", a.sum(dim=1).cpu().tolist())

row = a[1]  # a view: writing through it changes `a`
row.fill_(-1)
print("after a[1].fill_(-1):", a.cpu().tolist())

b = a.to("openreg:1")
print("copied to", b.device, "->", b.cpu().tolist())

try:
    a + b
except RuntimeError as e:
    print("mixing devices raises:", str(e).splitlines()[0])
