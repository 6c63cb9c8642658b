"""Slurm <-> Kubernetes state sync (``autoheal sync``).

Modules: ``plan`` (pure reconcile steps), ``conditions``/``mapping``/``names`` (pure helpers),
``engine`` (one pass: read, plan, apply), ``kube`` (the Kubernetes adapter), ``informer`` (list+watch
caches), ``leader`` (Lease election), ``ratelimit``, ``metrics``, ``logs``, ``daemon`` and ``cli``.
Nothing here imports ``kubernetes`` at import time of this package. The in-memory Kubernetes the tests
and benches use is ``autoheal_lab.testing.kube`` (the lab's distribution).
"""
