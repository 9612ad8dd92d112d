#!/usr/bin/env python3
"""The import graph of the overlay modules (run by lint.sh); see torch_patch_stack/imports.py."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from torch_patch_stack.imports import main

if __name__ == "__main__":
    sys.exit(main())
