"""slurm-autoheal: self-healing Slurm GPU clusters.

The core (this package's own modules) holds what every part shares: config, the Slurm adapter,
reasons, the journal and the notifier. The four parts live in their own folders and are mapped into
this namespace by setup.cfg: ``autoheal.hooks``, ``autoheal.slurm_conf``, ``autoheal.sbatch_helpers``
and ``autoheal.k8s_sync``.
"""

__version__ = "0.1.0"
