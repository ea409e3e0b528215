"""``python -m torch_openreg info [--op NAME | --fallbacks] [--json]``: see torch_openreg/info.py."""

import sys

from torch_openreg.info import main

sys.exit(main())
