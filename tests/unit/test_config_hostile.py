"""Configs that used to crash the loader or pass validation although they can never work.

Issue 16, findings 3 and 15: a RecursionError/TypeError from the loader made every prolog exit 1 (and
Slurm drain the node); ``config validate`` said ok to a signal named ``USR2; rm -rf /``. Every case
here must be a one-line ConfigError that names the key path and shows the value.
"""

from __future__ import annotations

import os
import threading

import pytest

from autoheal.config import Config, ConfigError, load_config, parse_config, sync_section, to_mapping
from autoheal.config.schema import from_mapping


def _error(text: str, source: str = "c.toml") -> str:
    with pytest.raises(ConfigError) as err:
        parse_config(text, source)
    msg = str(err.value)
    assert msg.startswith(f"{source}: ")
    assert "\n" not in msg and "\r" not in msg
    return msg


# ---- finding 3: the loader must never crash -------------------------------------------------------------

@pytest.mark.parametrize("text", [
    "a = " + "[" * 2000 + "]" * 2000,
    "a = " + "{b = " * 2000 + "1" + "}" * 2000,
    "[hooks]\nxid_policy = " + "[" * 5000,
])
def test_deeply_nested_toml_is_a_config_error_not_recursion(text):
    msg = _error(text)
    assert "not valid TOML" in msg


def test_deeply_nested_toml_file_through_load_config(tmp_path):
    f = tmp_path / "deep.toml"
    f.write_text("[sync]\nx = " + "[" * 3000 + "]" * 3000 + "\n")
    with pytest.raises(ConfigError, match="nested too deeply"):
        load_config(f)


_CR = "[sync]\nreplacement_action = 'custom-resource'\nreplacement_template = '''{}'''\n"


@pytest.mark.parametrize("template, fragment", [
    ('{"apiVersion": 1, "kind": "K", "metadata": {"name": "{node}"}}', "apiVersion 1 must be a string group/version"),
    ('{"apiVersion": ["a/b"], "kind": "K", "metadata": {"name": "n"}}', "apiVersion ['a/b']"),
    ('{"apiVersion": "v1", "kind": "K", "metadata": {"name": "n"}}', "apiVersion 'v1'"),
    ('{"apiVersion": "a.io/", "kind": "K", "metadata": {"name": "n"}}', "apiVersion 'a.io/'"),
    ('{"apiVersion": "a.io/v1", "kind": 5, "metadata": {"name": "n"}}', "kind 5 must be a string"),
    ('{"apiVersion": "a.io/v1", "kind": "Node Replacement", "metadata": {"name": "n"}}', "kind 'Node Replacement'"),
    ('{"apiVersion": "a.io/v1", "kind": "K"}', "metadata must hold a name"),
    ('{"apiVersion": "a.io/v1", "kind": "K", "metadata": {"name": 3}}', "metadata must hold a name"),
    ('["a.io/v1"]', "must be a JSON object"),
    ("{node}", "is not JSON"),
    ("[" * 100000, "is not JSON"),  # json.loads recursion
])
def test_replacement_template_wrong_shapes_are_named(template, fragment):
    msg = _error(_CR.format(template))
    assert "sync.replacement_template: " in msg
    assert fragment in msg


def test_replacement_template_may_span_lines():
    cfg = parse_config(_CR.format('{\n  "apiVersion": "autoheal.io/v1alpha1",\n\t"kind": "NodeReplacement",\n'
                                  '  "metadata": {"generateName": "r-"}\n}'))
    assert cfg.sync.replacement_action == "custom-resource"


def test_default_template_is_valid_for_custom_resource():
    assert parse_config("[sync]\nreplacement_action = 'custom-resource'\n").sync.replacement_template


@pytest.mark.parametrize("key, escaped", [
    ("[hooks]\nstate_dir", "\\x00"),
    ("[journal]\npath", "\\x00"),
    ("[slurm]\nbin_dir", "\\x00"),
    ("[sbatch]\ncheckpoint_dir", "\\x00"),
])
def test_nul_in_a_path_setting_is_named(key, escaped):
    msg = _error(f'{key} = "/var/lib/a\\u0000b"\n')
    section, name = key.strip("[").replace("]\n", ".").split(".")
    assert f"{section}.{name}: '/var/lib/a\\x00b' holds the control character '{escaped}'" in msg


@pytest.mark.parametrize("toml, where", [
    ('[journal]\npath = "/tmp/x\\nj"\n', "journal.path"),
    ('[hooks]\nstate_dir = "/tmp/\\u001b[31m"\n', "hooks.state_dir"),
    ('[slurm]\nrest_user = "root\\r\\nX-Evil: 1"\n', "slurm.rest_user"),
    ('[sbatch]\npython = "/usr/bin/py\\u007f"\n', "sbatch.python"),
    ('[notify]\nwebhooks = ["https://h/\\u0085"]\n', "notify.webhooks[0]"),
    ('[notify]\ncluster_name = "c\\tl"\n', "notify.cluster_name"),
    ('[hooks]\nxid_policy = {"7\\n" = "warn"}\n', 'hooks.xid_policy."7\\n"'),
    ('[sync]\nremediate_reasons = ["autoheal: replace:\\n"]\n', "sync.remediate_reasons[0]"),
])
def test_control_characters_anywhere_are_refused(toml, where):
    msg = _error(toml)
    assert f"{where}: " in msg
    assert "control character" in msg


def test_lone_surrogate_is_refused():
    assert "lone surrogate" in _error("[journal]\npath = '/x\udc80'\n")


def test_unknown_key_with_control_characters_stays_one_line():
    msg = _error('[slurm]\n"bad\\nkey" = 1\n')
    assert "unknown key 'slurm.\"bad\\nkey\"'" in msg


def test_huge_key_is_cut_in_the_message():
    msg = _error(f'[slurm]\n{"k" * 5000} = 1\n')
    assert len(msg) < 400


@pytest.mark.parametrize("toml, fragment", [
    ("[slurm]\ntimeout = " + "9" * 400 + "\n", "slurm.timeout: expected a finite number"),
    ("[notify]\ntimeout = -" + "9" * 400 + "\n", "notify.timeout: expected a finite number"),
    ("[slurm]\nretries = " + "9" * 400 + "\n", "slurm.retries: 9999"),
    ("[sync]\nremediate_xids = [0]\n", "sync.remediate_xids[0]: 0 is not an XID"),
    ("[sync]\nremediate_xids = [79, 99999999999999999999]\n", "sync.remediate_xids[1]"),
])
def test_huge_and_impossible_numbers(toml, fragment):
    assert fragment in _error(toml)


def test_long_value_is_cut_in_the_message():
    msg = _error(f"[sbatch]\nsignal = '{'X' * 100000}'\n")
    assert len(msg) < 400 and "sbatch.signal" in msg


def test_validator_bug_is_still_one_config_error_line(monkeypatch):
    def broken(self):
        raise KeyError("oops")

    monkeypatch.setattr(sync_section.SyncSection, "validate", broken)
    msg = _error("[sync]\nnamespace = 'x'\n")
    assert "cannot validate (KeyError" in msg


# ---- files that are not config files ---------------------------------------------------------------------

def test_fifo_as_config_does_not_hang(tmp_path):
    fifo = tmp_path / "autoheal.toml"
    os.mkfifo(fifo)
    out = {}

    def load():
        try:
            load_config(fifo)
        except ConfigError as exc:
            out["err"] = str(exc)

    t = threading.Thread(target=load, daemon=True)
    t.start()
    t.join(20)
    if t.is_alive():  # unblock the reader before failing, so the test run can end
        with open(fifo, "w"):
            pass
        pytest.fail("load_config blocked on a FIFO")
    assert "not a regular file" in out["err"]


def test_oversized_config_is_refused(tmp_path):
    f = tmp_path / "big.toml"
    f.write_text("# " + "x" * (2 << 20) + "\n")
    with pytest.raises(ConfigError, match="a config is at most"):
        load_config(f)


def test_utf8_bom_is_accepted(tmp_path):
    f = tmp_path / "bom.toml"
    f.write_bytes("\ufeff[slurm]\nretries = 4\n".encode())
    assert load_config(f).slurm.retries == 4


def test_file_name_with_newline_gives_one_line(tmp_path):
    f = tmp_path / "a\nb.toml"
    f.write_text("[slurm]\nretries = 'x'\n")
    with pytest.raises(ConfigError) as err:
        load_config(f)
    assert "\n" not in str(err.value) and "a\\nb.toml" in str(err.value)


# ---- finding 15: values that can never work ---------------------------------------------------------------

@pytest.mark.parametrize("value, fragment", [
    ("USR2; rm -rf /", "'USR2; rm -rf /' is not a signal name"),
    ("FOO", "'FOO' is not a signal name; use one of HUP"),
    ("B:USR2@90", "no B: scope, no @seconds"),
    ("KILL", "cannot be caught"),
    ("SIGSTOP", "cannot be caught"),
    ("", "'' is not a signal name"),
])
def test_sbatch_signal_must_be_a_catchable_slurm_signal(value, fragment):
    msg = _error(f"[sbatch]\nsignal = '{value}'\n")
    assert "sbatch.signal: " in msg
    assert fragment in msg


@pytest.mark.parametrize("value", ["USR2", "SIGUSR2", "usr2", " sigusr2 "])
def test_sbatch_signal_spellings_become_the_canonical_name(value):
    assert parse_config(f"[sbatch]\nsignal = '{value}'\n").sbatch.signal == "USR2"


@pytest.mark.parametrize("section, a, b", [
    ("sbatch", "max_restarts = 3", "max-restarts = 4"),
    ("sbatch", "max-restarts = 4", "max_restarts = 3"),
    ("slurm", "bin_dir = '/a'", "bin-dir = '/b'"),
    ("sync", "remediation_grace_seconds = 1", "remediation-grace-seconds = 2"),
])
def test_both_spellings_of_one_key_name_both(section, a, b):
    msg = _error(f"[{section}]\n{a}\n{b}\n")
    first, second = a.split(" =")[0], b.split(" =")[0]
    assert f"'{section}.{first}' and '{section}.{second}' are the same setting, set twice" in msg


def test_both_spellings_in_an_inline_table():
    msg = _error("sbatch = {max_restarts = 3, max-restarts = 4}\n")
    assert "'sbatch.max_restarts' and 'sbatch.max-restarts'" in msg


@pytest.mark.parametrize("toml, fragment", [
    # notify: a URL the notifier would silently drop
    ("[notify]\nwebhooks = ['ftp://h/x']\n", "notify.webhooks[0]: 'ftp://h/x' must start with http:// or https://"),
    ("[notify]\nwebhooks = ['https://ok/', 'http://']\n", "notify.webhooks[1]: 'http://' has no host"),
    ("[notify]\nwebhooks = ['http://h:99999/x']\n", "Port out of range"),
    ("[notify]\nwebhooks = ['http://h/a b']\n", "holds white space"),
    ("[notify]\nwebhooks = ['https://hooks.example/ünïcode']\n", "is not ASCII; percent-encode"),
    ("[slurm]\nrest_user = 'Jörg'\n", "slurm.rest_user: 'Jörg' must be printable ASCII without spaces"),
    ("[slurm]\nrest_user = 'a b'\n", "slurm.rest_user: "),
    ("[sync]\npod_selector = 'app=slurmd,tier in (a'\n", "sync.pod_selector: "),
    ("[sync]\npod_selector = 'app = slurm d'\n", "is not a label selector requirement"),
    # slurm
    ("[slurm]\nrest_url = 'unix:run/s.sock'\n", "slurm.rest_url: 'unix:run/s.sock': the socket must be an absolute"),
    ("[slurm]\nrest_url = 'http://'\n", "slurm.rest_url: 'http://' has no host"),
    ("[slurm]\nrest_api_version = 'v0.0.40/../../x'\n", "slurm.rest_api_version: 'v0.0.40/../../x' is not 'auto'"),
    ("[slurm]\nrest_token_env = 'A=B'\n", "slurm.rest_token_env: 'A=B' is not an environment variable name"),
    ("[slurm]\nbin_dir = '" + "/d" * 2100 + "'\n", "slurm.bin_dir: "),
    ("[slurm]\nslurm_conf = '/etc/" + "s" * 300 + "/slurm.conf'\n", "longer than 255 bytes"),
    # journal
    ("[journal]\npath = ''\n", "journal.path: must be a file path, not empty"),
    ("[journal]\npath = '/var/log/autoheal/'\n", "journal.path: '/var/log/autoheal/' names a directory"),
    # sbatch
    ("[sbatch]\ncheckpoint_dir = '/ckpt/" + "c" * 256 + "'\n", "sbatch.checkpoint_dir: "),
    # sync: Kubernetes names the API server always refuses
    ("[sync]\nnamespace = 'Slurm_NS'\n", "sync.namespace: 'Slurm_NS' is not a valid Kubernetes namespace"),
    ("[sync]\nnamespace = ''\n", "sync.namespace: "),
    ("[sync]\nlease_name = '-lease'\n", "sync.lease_name: "),
    ("[sync]\nbreaker_configmap = 'Breaker'\n", "sync.breaker_configmap: "),
    ("[sync]\ntaint_key = 'gpu unhealthy'\n", "sync.taint_key: 'gpu unhealthy' is not a valid Kubernetes key"),
    ("[sync]\nnode_label = 'UPPER.io/x'\n", "the prefix 'UPPER.io' is not a DNS subdomain"),
    ("[sync]\ncordon_reason_annotation = ''\n", "sync.cordon_reason_annotation: "),
    ("[sync]\nannotation_prefix = 'autoheal.io/'\n", "sync.annotation_prefix: "),
    ("[sync]\ncondition_prefix = 'Slurm Node'\n", "sync.condition_prefix: 'Slurm Node' does not make valid"),
    ("[sync]\ndrain_on_taints = ['nvidia.com/gpu-error:Sometimes']\n", "effect 'Sometimes' is not one of"),
    ("[sync]\ndrain_on_taints = ['bad key']\n", "sync.drain_on_taints[0]: 'bad key'"),
    ("[sync]\ndrain_on_conditions = ['=True']\n", "sync.drain_on_conditions[0]: '=True': the condition type is empty"),
    ("[sync]\ndrain_on_conditions = ['Ready=Maybe']\n", "status must be True, False or Unknown"),
    ("[sync]\nremediate_reasons = ['replace:']\n", "sync.remediate_reasons[0]: 'replace:' does not start with"),
    ("[sync]\nremediate_reasons = ['']\n", "sync.remediate_reasons[0]: '' does not start with"),
    ("[sync]\nopt_out_label = 'a=b c'\n", "sync.opt_out_label: 'b c' is not a valid label value"),
    ("[sync]\nreplacement_label = '=x'\n", "sync.replacement_label: '=x' must be key=value"),
    ("[sync]\nreplacement_webhook = 'ftp://h'\n", "sync.replacement_webhook: 'ftp://h' must start with http"),
    ("[sync]\nreplacement_action = 'webhook'\n", "sync.replacement_webhook: the 'webhook' action needs"),
    ("[sync]\nspare_reason_prefix = '  '\n", "sync.spare_reason_prefix: must not be empty"),
    ("[sync]\nmetrics_address = 'not an address!'\n", "sync.metrics_address: 'not an address!' is neither"),
    ("[sync]\nenabled_steps = ['slurm-to-pods', 'everything']\n", "sync.enabled_steps[1]: unknown step 'everything'"),
    ("[sync]\nkubeconfig = '/k/" + "k" * 300 + "'\n", "sync.kubeconfig: "),
])
def test_values_that_can_never_work_are_refused(toml, fragment):
    assert fragment in _error(toml)


@pytest.mark.parametrize("toml", [
    "[notify]\nwebhooks = ['https://hooks.slack.com/services/T0/B0/X', 'http://10.0.0.1:8080/hook']\n",
    "[notify]\nwebhooks = ['http://[::1]:9000/x']\n",
    "[slurm]\nbackend = 'rest'\nrest_url = 'unix:/run/slurmrestd/slurmrestd.socket'\nrest_api_version = 'v0.0.41'\n",
    "[slurm]\nrest_token_env = ''\nrest_token_file = '/etc/slurm/jwt'\n",
    "[journal]\npath = 'relative/journal.jsonl'\n",
    "[sbatch]\ncheckpoint_dir = '/scratch/%u/%x/%j'\nsignal = 'TERM'\n",
    "[sync]\nnamespace = 'slurm-prod'\nlease_name = 'autoheal.sync'\ntaint_key = 'example.com/autoheal'\n"
    "drain_on_taints = ['nvidia.com/gpu-error', 'a=b', 'c:NoExecute', 'd=e:PreferNoSchedule']\n"
    "drain_on_conditions = ['GpuHealthy=False', 'KernelDeadlock']\n"
    "remediate_reasons = ['autoheal: replace:', 'autoheal: reboot:']\nmetrics_address = '::'\n",
    "[sync]\nmetrics_address = 'metrics.svc.cluster.local'\n",
    "[sync]\npod_selector = 'app.kubernetes.io/component=slurmd,tier in (gpu, a100),!draining,x!=y'\n",
    "[sync]\npod_selector = ''\n",
    "[slurm]\nrest_user = 'svc-slurm@corp.example'\n",
    "[sync]\nmetrics_address = ''\nopt_out_label = 'autoheal.io/auto-replace='\n",
    "[sync]\nreplacement_action = 'webhook'\nreplacement_webhook = 'https://provider.example/replace'\n",
])
def test_working_values_still_load(toml):
    parse_config(toml)


def test_every_default_passes_its_own_validation():
    """Defaults never go through the parsers; they must pass them unchanged (already normalised)."""
    data = to_mapping(Config())
    data.pop("source")
    assert from_mapping(Config, data) == Config()

