"""transformers' test device spec for openreg: run transformers' own model tests on the
device with ``TRANSFORMERS_TEST_DEVICE_SPEC`` (docs/ci.md). transformers imports the
file by its path relative to the working directory, so copy it there first::

    python -c "import shutil, torch_openreg.transformers_device_spec as s; shutil.copy(s.__file__, 'openreg_spec.py')"
    TRANSFORMERS_TEST_DEVICE_SPEC=openreg_spec.py python -m pytest tests/models/gpt2
"""

import torch

import torch_openreg  # noqa: F401 (also with TORCH_DEVICE_BACKEND_AUTOLOAD=0)

DEVICE_NAME = "openreg"
MANUAL_SEED_FN = torch.openreg.manual_seed
EMPTY_CACHE_FN = torch.openreg.empty_cache
DEVICE_COUNT_FN = torch.openreg.device_count
