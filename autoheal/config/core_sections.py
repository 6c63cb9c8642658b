"""Config sections the core itself uses: Slurm access, the journal, notifications."""

from __future__ import annotations

from autoheal.config import values as V
from autoheal.config.schema import setting
from autoheal.errors import ConfigError
from autoheal.records import record

TYPE_CHECKING = False  # typing only for mypy: the hooks load this module on every run
if TYPE_CHECKING:
    from typing import List, Optional


@record
class SlurmSection:
    """How autoheal talks to Slurm."""

    backend: str = setting("cli", doc="Slurm backend: 'cli' (scontrol/sinfo/squeue), 'rest' (slurmrestd) "
                           "or 'pyslurm' (optional, needs a matching pyslurm build).",
                           choices=("cli", "rest", "pyslurm"))
    bin_dir: str = setting("", doc="Directory holding scontrol/sinfo/squeue/sbatch. Empty: search PATH, "
                           "then /usr/bin, /usr/local/bin, /opt/slurm/bin (HealthCheckProgram has no PATH).",
                           parse=V.path)
    slurm_conf: str = setting("", doc="SLURM_CONF to export to Slurm commands. Empty: Slurm's default.",
                             parse=V.path)
    timeout: float = setting(10.0, doc="Seconds before a Slurm command or REST call is abandoned "
                             "(then treated as 'slurmctld unreachable', never as a reason to drain).",
                             min=0.1, max=600)
    retries: int = setting(2, doc="Retries (with backoff) of read calls that failed for lack of an answer.",
                           min=0, max=10)
    rest_url: str = setting("", doc="slurmrestd URL: http://host:port or unix:/path/to/socket.",
                            parse=V.optional(V.rest_url))
    rest_api_version: str = setting("auto", doc="OpenAPI plugin version, e.g. v0.0.38 or v0.0.40; "
                                    "'auto' asks the server.", parse=V.rest_api_version)
    rest_user: str = setting("", doc="X-SLURM-USER-NAME for JWT auth (empty: local auth over a unix socket).",
                             parse=V.optional(V.http_header_value))
    rest_token_file: str = setting("", doc="File holding the JWT (X-SLURM-USER-TOKEN). Never logged.",
                                   parse=V.path)
    rest_token_env: str = setting("SLURM_JWT", doc="Env var holding the JWT when no token file is set.",
                                  parse=V.optional(V.env_var_name))
    rest_ca_file: str = setting("", doc="CA bundle (PEM) that signed slurmrestd's TLS certificate, for an "
                                "https:// rest_url with a private CA. Empty: the system's CAs.", parse=V.path)
    rest_allow_http: bool = setting(False, doc="Allow a plain http:// rest_url to a host other than this one "
                                    "(the JWT then crosses the network in clear text: only on a network you "
                                    "trust, e.g. a service mesh that encrypts pod traffic).")

    def validate(self) -> None:
        if self.backend == "rest" and not self.rest_url:
            raise ConfigError("slurm.rest_url: must be set when slurm.backend = 'rest'")
        if self.backend == "rest" and not self.rest_allow_http and V.plain_http_off_host(self.rest_url):
            raise ConfigError(f"slurm.rest_url: {self.rest_url!r} would send the Slurm token in clear text to "
                              "another host: use https:// (slurmrestd 25.05+ TLS or a TLS proxy in front of it) "
                              "or set slurm.rest_allow_http = true on a trusted network")


@record
class JournalSection:
    """The append-only remediation record."""

    path: str = setting("/var/lib/autoheal/journal.jsonl",
                        doc="JSON-lines journal of every detection and action (fsync'd).",
                        parse=V.nonempty_path)
    fsync: bool = setting(True, doc="fsync after each record. Turn off only on throwaway labs.")
    job_spool: str = setting("/var/spool/autoheal/jobs", doc="Node-local folder (root's, mode 1733) where the "
                             "job runner, running as the job's user, leaves its records; the epilog (root) moves "
                             "them into the journal marked as the user's (source 'job') and posts them. The "
                             "epilog creates it when missing. The runner never writes the journal itself "
                             "unless it runs as root.", parse=V.nonempty_path)


@record
class NotifySection:
    """Where records are posted for humans."""

    webhooks: List[str] = setting(default_factory=list, doc="Webhook URLs (Slack-compatible JSON "
                                  "{'text': ...}) that receive each journal record (http:// or https:// only). "
                                  "Deprecated here: whoever reads this file can post fake alerts to them; put "
                                  "them in secrets_file.", item=V.http_url)
    secrets_file: str = setting("/etc/autoheal/secrets.toml", doc="Root-only file (0600) holding the site's "
                                "secrets: `[notify] webhooks = [...]`, added to the ones above. Read by root's "
                                "processes (hooks, guard, sync); the job runner never reads it. Missing: none.",
                                parse=V.nonempty_path)
    timeout: float = setting(3.0, doc="Seconds one webhook attempt may take in total (connect, send, the "
                            "whole answer): a hung or trickling server is cut off then. Sending never "
                            "delays healing.", min=0.1, max=60)
    retries: int = setting(2, doc="Retries per webhook after the first attempt.", min=0, max=10)
    min_severity: str = setting("action", doc="Post records of this severity and above.",
                                choices=("info", "action", "error"))
    cluster_name: Optional[str] = setting(None, doc="Name shown in notifications; default: Slurm's ClusterName.")
    job_burst: int = setting(1, doc="Records about one job with the same event posted per job_window by a "
                             "long-running sender (guard, xid-watch, sync); the rest are held back and one "
                             "summary is posted when the window ends. A user looping requeues on their own job "
                             "cannot flood the on-call. 0: no limit.", min=0, max=1000)
    job_window: float = setting(600.0, doc="Seconds of one job_burst window.", min=1, max=86400)
    job_tracked: int = setting(1000, doc="(job, event) pairs the limit remembers at most (the oldest is "
                               "summarised and forgotten first): bounded memory.", min=1, max=1_000_000)
