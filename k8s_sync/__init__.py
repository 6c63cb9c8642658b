"""Slurm <-> Kubernetes state sync (``autoheal sync``).

Modules: ``plan`` (pure reconcile steps), ``conditions``/``mapping``/``names`` (pure helpers),
``engine`` (one pass: read, plan, apply), ``kube`` (the Kubernetes adapter), ``memory`` (in-memory
adapters), ``informer`` (list+watch caches), ``leader`` (Lease election), ``ratelimit``, ``metrics``,
``logs``, ``daemon`` and ``cli``. Nothing here imports ``kubernetes`` at import time of this package.
"""
