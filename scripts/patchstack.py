#!/usr/bin/env python3
"""Entry point for the patch stack tooling; see torch_patch_stack/cli.py."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from torch_patch_stack.cli import main

if __name__ == "__main__":
    sys.exit(main())
