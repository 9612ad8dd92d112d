"""The project's own package: the patch stack tooling and its ``patchstack`` CLI.

The patched torch itself is built from the official wheel by
``scripts/bootstrap.sh`` (``patchstack build``); it is not a dependency here so
that installing this package never pulls a different torch.
"""

from setuptools import find_packages, setup

setup(
    name="torch-collective-autotune-stack",
    version="0.1.0",
    description="Rank-consistent collective-op autotuning for PyTorch Inductor, as a patch stack",
    packages=find_packages(include=["torch_patch_stack", "torch_patch_stack.*"]),
    python_requires="==3.11.*",
    extras_require={
        # redis: the client of Inductor's remote caches, for the shared-cache tests;
        # tlparse: reads TORCH_TRACE logs, as users do, for the trace tests.
        "test": [
            "pytest",
            "expecttest",
            "hypothesis",
            "numpy",
            "redis",
            "tlparse==0.4.3",
        ]
    },
    entry_points={"console_scripts": ["patchstack = torch_patch_stack.cli:main"]},
)
