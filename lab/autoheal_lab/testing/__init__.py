"""Test doubles shared by the tests and the benches, shipped only with the lab (``slurm-autoheal-lab``):
``slurm.MemorySlurm`` (a SlurmAdapter over dicts of nodes and jobs) and ``kube.MemoryKube`` (an
in-memory Kubernetes behind ``KubeClient``). The product never imports them."""
