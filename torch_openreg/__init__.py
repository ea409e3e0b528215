"""openreg: a simulated accelerator that PyTorch sees as the device ``openreg``.

Importing this package (``import torch`` does it through the ``torch.backends``
entry point) loads the C++ extension, which registers the operator kernels, the
CPU fallback, the allocator, the device guard and the PrivateUse1 hooks; then it
renames PrivateUse1 to ``openreg`` and installs ``torch.openreg``.
"""



def _autoload() -> None:
    """Entry point of the ``torch.backends`` group: importing this module did the work."""


# Defined before `import torch`: when a program imports torch_openreg before
# torch, torch's autoload finds this module half-initialised and calls
# _autoload, which must already exist; the rest of this file then finishes.
import importlib  # noqa: E402

import torch  # noqa: E402

from torch_openreg import _C  # noqa: F401  (loading it registers the backend)

# Raises a RuntimeError that explains a malformed OPENREG_DEVICE_COUNT or
# OPENREG_DEVICE_MEMORY. Initialisation itself waits for the first use.
_C._check_config()

torch.utils.rename_privateuse1_backend("openreg")
# torch.accelerator.Graph finds a device's graph by the backend's name.
_C._register_graph_impl()

from torch_openreg import _import_hooks, openreg  # noqa: E402
from torch_openreg.openreg import _dlpack  # noqa: E402

torch._register_device_module("openreg", openreg)
# Tensor.__dlpack_device__ knows PrivateUse1 only by its original name.
_dlpack.register()
# Tensor.openreg(), Tensor.is_openreg, Module.openreg(), UntypedStorage.openreg(), ...
torch.utils.generate_methods_for_privateuse1_backend(
    for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True
)

# torch.compile: dynamo needs openreg's DeviceInterface as soon as it traces,
# Inductor openreg's code generator before it lowers a graph. Both modules take
# seconds to import and most programs never load them, so each registration
# runs when its module has been imported (docs/integration/autoload.md).
_import_hooks.when_imported(
    "torch._dynamo.device_interface",
    lambda _: importlib.import_module("torch_openreg.openreg._dynamo").register(),
)
_import_hooks.when_imported(
    "torch._inductor.compile_fx",
    lambda _: importlib.import_module("torch_openreg.openreg._inductor").register(),
)

# Fake tensors (torch.compile, torch.export) must predict the strides openreg's
# convolution returns, which are CPU's (torch_openreg/openreg/_fake_tensor.py).
# torch imports fake_impls itself, so this usually runs at once.
_import_hooks.when_imported(
    "torch._subclasses.fake_impls",
    lambda _: importlib.import_module("torch_openreg.openreg._fake_tensor").register(),
)

__all__ = ["openreg"]
