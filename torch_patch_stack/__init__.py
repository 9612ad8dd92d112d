"""Tooling for the rank-consistent collective autotuning patch stack.

The stack is a series of patches against one PyTorch release (``patches/``;
``patches/series`` names the release) plus new modules at their ``torch/``
paths (``torch_overlay/``).  This package turns the series into a patch queue
(a disposable git tree), exports the queue back to files, checks that the two
agree, rebases the queue onto another release, builds a patched wheel from the
official wheel, and applies the stack to a PyTorch source checkout for
upstreaming.
"""

STACK_NAME = "inductor-collective-autotuning"
