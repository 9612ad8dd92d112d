"""Tooling for the rank-consistent collective autotuning patch stack.

The stack is a series of patches against PyTorch v2.13.0 (``patches/``) plus new
modules at their ``torch/`` paths (``torch_overlay/``).  This package turns the
series into a patch queue (a disposable git tree), exports the queue back to
files, checks that the two agree, builds a patched wheel from the official
wheel, and applies the stack to a PyTorch source checkout for upstreaming.
"""

BASE_TORCH_VERSION = "2.13.0"
STACK_NAME = "inductor-collective-autotuning"
