"""The lab's version is the product's (autoheal/__init__.py), and it needs exactly that product, with
the Kubernetes extra (the lab runs `autoheal sync` against its real control plane), and NVIDIA's nvml.h
(nvidia-nvml-dev) to compile its fake NVML."""

import ast
from pathlib import Path

from setuptools import setup

INIT = Path(__file__).resolve().parent.parent / "autoheal" / "__init__.py"
VERSION = next(node.value.value for node in ast.parse(INIT.read_text()).body
               if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "__version__")

setup(version=VERSION, install_requires=[f"slurm-autoheal[k8s]=={VERSION}", "nvidia-nvml-dev"])
