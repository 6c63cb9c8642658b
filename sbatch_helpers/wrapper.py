"""``autoheal sbatch`` without side effects: read the user's script and options, merge the defaults,
detect conflicts, and build the final sbatch argv plus the generated batch script.

Precedence of the wrapper's own settings, lowest first: the config file's ``[sbatch]`` section, the
script's ``#SBATCH --signal=B:SIG@secs`` line (if any), the script's ``#AUTOHEAL`` lines, the command line.

The generated batch script keeps the user's ``#SBATCH`` header verbatim (so sbatch reads the same
options), embeds the user's script byte for byte in a quoted here-document (sbatch semantics: the job
runs the script as it was at submission, also after a requeue), and ``exec``\\ s the job runner, which
thereby *is* the batch shell and receives the ``B:`` grace signal.

Every other string that lands in the generated script (paths, the user's arguments, option values, the
config path) is written as one shell word on one line (:func:`shell_word`): a newline or any other
control character can neither start a new command nor a new ``#SBATCH`` line. Paths and option values
that would carry control characters into file names, job names or the runner's environment are refused
(:class:`WrapperError`, exit 2) instead.

Each submission gets a random token (``AUTOHEAL_SUBMIT_TOKEN`` in the generated script, the same for every
requeue of the job, different for a new job that reuses the job id). The default checkpoint folder
contains it, and the checkpoint API records it as the checkpoint's owner (see ``checkpoint.py``).
"""

from __future__ import annotations

import hashlib
import os
import secrets
import shlex
import unicodedata
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from autoheal.config.sbatch_section import SbatchSection, limits
from autoheal.errors import AutohealError
from autoheal.reasons import COMMENT_SEPARATOR, MAX_COMMENT_LEN, sanitize
from autoheal.reasons import RUNNER_MARKER as MARKER
from autoheal.sbatch_helpers.checkpoint import ALLOW_FOREIGN_ENV, TOKEN_ENV, TOKEN_PATTERN

RUNNER_MODULE = "autoheal.sbatch_helpers.runner"
# The generated script exports TOKEN_ENV (the submission's token) and, when asked, ALLOW_FOREIGN_ENV=1;
# the runner and the user's processes inherit them and checkpoint.py reads them.
DEFAULT_CHECKPOINT_DIR = "autoheal-checkpoints/%j-{token}"

# sbatch options that take a value (long names without "--", short letters). Anything else that starts
# with "-" is a flag. Options with an *optional* value must be written --opt=value (sbatch's own rule).
_LONG_WITH_VALUE = frozenset("""
account acctg-freq array batch begin bb bbf chdir cluster-constraint clusters comment constraint
container container-id core-spec cores-per-socket cpu-freq cpus-per-gpu cpus-per-task deadline delay-boot
dependency distribution error exclude export-file extra extra-node-info gid gpu-bind gpu-freq gpus
gpus-per-node gpus-per-socket gpus-per-task gres gres-flags hint input job-name kill-on-invalid-dep licenses
mail-type mail-user mcs-label mem mem-bind mem-per-cpu mem-per-gpu mincpus network nice nodefile nodelist
nodes ntasks ntasks-per-core ntasks-per-gpu ntasks-per-node ntasks-per-socket open-mode output partition
power prefer priority profile qos reservation signal sockets-per-node switches thread-spec threads-per-core
time time-min tmp tres-bind tres-per-task uid wait-all-nodes wckey wrap cluster M
""".split())
_SHORT_WITH_VALUE = frozenset("AabBcCDdeFGiJLMmnNopqStwx")
_SHORT_ALIASES = {"A": "account", "a": "array", "b": "begin", "B": "extra-node-info", "c": "cpus-per-task",
                  "C": "constraint", "D": "chdir", "d": "dependency", "e": "error", "F": "nodefile",
                  "G": "gpus", "i": "input", "J": "job-name", "L": "licenses", "M": "clusters",
                  "m": "distribution", "n": "ntasks", "N": "nodes", "o": "output", "p": "partition",
                  "q": "qos", "S": "core-spec", "t": "time", "w": "nodelist", "x": "exclude",
                  "H": "hold", "k": "no-kill", "O": "overcommit", "Q": "quiet", "s": "oversubscribe",
                  "v": "verbose", "W": "wait", "h": "help", "V": "version", "u": "usage"}


class WrapperError(AutohealError):
    """Bad input to ``autoheal sbatch``: missing script, conflicting or malformed options (exit 2)."""


# ---- strings that reach the generated script ------------------------------------------------------

# Characters a shell word must never carry literally: C0/C1 controls (newline, CR, ESC...), invalid UTF-8
# (surrogate escapes), line/paragraph separators and invisible format characters (bidi overrides would
# make the dry-run output lie about what runs).
_ESCAPED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


def has_control(text: str) -> bool:
    """True when ``text`` holds a control character (newline, tab, CR, ESC, NUL, DEL, C1...)."""
    return any(unicodedata.category(ch) in ("Cc", "Cs") for ch in text)


def show(text: str) -> str:
    """``text`` for a one-line message: as is when printable, else its Python repr (``'a\\nb'``)."""
    return repr(text) if any(unicodedata.category(ch) in _ESCAPED_CATEGORIES for ch in text) else text


def shell_word(text: str, display: bool = False) -> str:
    """``text`` as exactly one bash word on one line.

    Plain text gets ``shlex.quote``; text with control or invisible characters gets ANSI-C quoting
    (``$'a\\x0ab'``) with those characters written as ``\\xHH`` escapes of their UTF-8 bytes (the exact
    original bytes, also for invalid UTF-8 kept as surrogate escapes). A NUL cannot be passed to a
    program at all: WrapperError, unless ``display`` (dry-run output only).
    """
    text = str(text)
    if "\x00" in text and not display:
        raise WrapperError(f"{show(text)}: contains a NUL character, which no program argument can hold")
    if not any(unicodedata.category(ch) in _ESCAPED_CATEGORIES for ch in text):
        return shlex.quote(text)
    out = []
    for ch in text:
        if ch in "\\'":
            out.append("\\" + ch)
        elif unicodedata.category(ch) in _ESCAPED_CATEGORIES:
            out.extend(f"\\x{b:02x}" for b in ch.encode("utf-8", "surrogateescape"))
        else:
            out.append(ch)
    return "$'" + "".join(out) + "'"


def _refuse_control(value: str, what: str) -> None:
    if has_control(value):
        raise WrapperError(f"{what} {show(value)}: contains a control character (newline, tab, escape...); "
                           f"refused so that it cannot reach the batch script, file names or job names")


@dataclass(frozen=True)
class SbatchOption:
    """One sbatch option as given: canonical long name, value (None for flags), original tokens."""

    name: str
    value: Optional[str]
    tokens: Tuple[str, ...]


def parse_sbatch_options(args: Sequence[str], stop_at_positional: bool = True
                         ) -> Tuple[List[SbatchOption], List[str]]:
    """Split sbatch-style arguments into options and the rest (from the first positional on).

    ``--`` ends the options. Raises WrapperError for an option missing its value.
    """
    opts: List[SbatchOption] = []
    i = 0
    args = list(args)
    while i < len(args):
        tok = args[i]
        if tok == "--":
            return opts, args[i + 1:]
        if tok.startswith("--") and len(tok) > 2:
            body = tok[2:]
            if "=" in body:
                name, value = body.split("=", 1)
                opts.append(SbatchOption(name, value, (tok,)))
            elif body in _LONG_WITH_VALUE:
                if i + 1 >= len(args):
                    raise WrapperError(f"sbatch option {tok} needs a value")
                opts.append(SbatchOption(body, args[i + 1], (tok, args[i + 1])))
                i += 1
            else:
                opts.append(SbatchOption(body, None, (tok,)))
        elif tok.startswith("-") and len(tok) > 1 and not tok[1].isdigit():
            letter = tok[1]
            name = _SHORT_ALIASES.get(letter, letter)
            if letter in _SHORT_WITH_VALUE:
                if len(tok) > 2:
                    value = tok[2:].lstrip("=")
                    opts.append(SbatchOption(name, value, (tok,)))
                else:
                    if i + 1 >= len(args):
                        raise WrapperError(f"sbatch option {tok} needs a value")
                    opts.append(SbatchOption(name, args[i + 1], (tok, args[i + 1])))
                    i += 1
            else:
                opts.append(SbatchOption(name, None, (tok,)))
        elif stop_at_positional:
            return opts, args[i:]
        else:
            raise WrapperError(f"unexpected argument {tok!r} in an #SBATCH line")
        i += 1
    return opts, []


# ---- the user's script ---------------------------------------------------------------------------


@dataclass
class ParsedScript:
    """What sbatch and the wrapper read from a batch script's header."""

    text: str
    sbatch_lines: List[str] = field(default_factory=list)  # verbatim, in order
    sbatch_options: List[SbatchOption] = field(default_factory=list)
    autoheal_args: List[str] = field(default_factory=list)


def _directive_args(line: str, prefix: str, where: str) -> List[str]:
    rest = line[len(prefix):]
    try:
        return shlex.split(rest, comments=True)
    except ValueError as exc:
        raise WrapperError(f"{where}: cannot parse {line.strip()!r}: {exc}") from None


def parse_script(text: str, where: str = "script") -> ParsedScript:
    """Read ``#SBATCH`` and ``#AUTOHEAL`` lines from the header (up to the first command, as sbatch does)."""
    if not text.startswith("#!"):
        raise WrapperError(f"{where}: the first line must start with #! followed by the path to an "
                           f"interpreter (sbatch requires it; e.g. #!/bin/bash)")
    if "\x00" in text:
        raise WrapperError(f"{where}: contains a NUL byte (binary, not a batch script)")
    if "\r\n" in text:
        raise WrapperError(f"{where}: has DOS line breaks (\\r\\n), which sbatch refuses; convert it first "
                           f"(e.g. dos2unix)")
    parsed = ParsedScript(text=text)
    # Lines as bash and sbatch see them: split on \n only (str.splitlines would also split on \r, \v,
    # \f, \x1c-\x1e, \x85, U+2028/9 and so disagree with them about where a line starts).
    for line in text.split("\n")[1:]:
        stripped = line.strip(" \t\n\v\f\r")  # C isspace(), as sbatch skips it
        if stripped and not stripped.startswith("#"):
            break
        if line.startswith("#SBATCH"):
            parsed.sbatch_lines.append(line)
            opts, rest = parse_sbatch_options(_directive_args(line, "#SBATCH", where), stop_at_positional=True)
            if rest:
                raise WrapperError(f"{where}: unexpected {rest[0]!r} in {line.strip()!r}")
            parsed.sbatch_options.extend(opts)
        elif line.startswith("#AUTOHEAL"):
            parsed.autoheal_args.extend(_directive_args(line, "#AUTOHEAL", where))
    return parsed


# ---- the wrapper's own options -------------------------------------------------------------------


#: The defaults of the wrapper's options are the ``[sbatch]`` section's (one place: the config schema).
_CONFIG_DEFAULTS = SbatchSection()


@dataclass
class WrapperOptions:
    """The settings the runner gets (after merging config, script and command line)."""

    grace: int = _CONFIG_DEFAULTS.grace
    signal: str = _CONFIG_DEFAULTS.signal
    max_restarts: int = _CONFIG_DEFAULTS.max_restarts
    checkpoint_dir: str = _CONFIG_DEFAULTS.checkpoint_dir
    exclude_failed: bool = _CONFIG_DEFAULTS.exclude_failed
    notify: List[str] = field(default_factory=list)
    requeue_margin: int = _CONFIG_DEFAULTS.requeue_margin
    python: str = _CONFIG_DEFAULTS.python
    allow_foreign_checkpoint: bool = False  # exported as AUTOHEAL_ALLOW_FOREIGN_CHECKPOINT=1, not a runner arg
    spare_nodes: int = 0  # hot spares inside the allocation (see hotspare.py)
    hang_after_fault: int = _CONFIG_DEFAULTS.hang_after_fault  # hang detection (hang.py)
    watchdog: int = _CONFIG_DEFAULTS.watchdog
    min_nodes: int = 0  # with spare_nodes: an elastic job goes on with this many nodes at least
    preload: str = ""  # modules the warm interpreters import, comma-separated (warm.py); "": none


# name -> (field, kind); kinds: int, str, bool-true, bool-false, list
WRAPPER_FLAGS: Dict[str, Tuple[str, str]] = {
    "--max-restarts": ("max_restarts", "int"),
    "--checkpoint-dir": ("checkpoint_dir", "str"),
    "--grace": ("grace", "int"),
    "--signal": ("signal", "str"),
    "--exclude-failed": ("exclude_failed", "true"),
    "--no-exclude-failed": ("exclude_failed", "false"),
    "--notify": ("notify", "list"),
    "--allow-foreign-checkpoint": ("allow_foreign_checkpoint", "true"),
    "--spare-nodes": ("spare_nodes", "int"),
    "--min-nodes": ("min_nodes", "int"),
    "--hang-after-fault": ("hang_after_fault", "int"),
    "--watchdog": ("watchdog", "int"),
    "--preload": ("preload", "str"),
}


def parse_signal_spec(value: str) -> Tuple[str, Optional[int]]:
    """``USR2`` / ``SIGUSR2`` / ``12`` / ``B:USR2@90`` -> (``"USR2"``, 90 or None). WrapperError if bad."""
    from autoheal.signals import SignalNameError, signal_name

    text = str(value).strip()
    grace: Optional[int] = None
    if "@" in text:
        text, secs = text.rsplit("@", 1)
        if not secs.strip().isdigit():
            raise WrapperError(f"--signal {value!r}: the part after @ must be seconds")
        grace = int(secs)
    if ":" in text:
        scope, text = text.split(":", 1)
        if scope.upper() not in ("B", "R", "RB", "BR"):
            raise WrapperError(f"--signal {value!r}: unknown scope {scope!r} (use B:)")
    try:
        return signal_name(text, catchable=True), grace
    except SignalNameError as exc:
        raise WrapperError(f"--signal {value!r}: {exc}") from None


def parse_wrapper_args(args: Sequence[str], where: str) -> Dict[str, Any]:
    """``--grace 60 --max-restarts=3 ...`` (as in ``#AUTOHEAL`` lines) -> {field: value}."""
    out: Dict[str, Any] = {}
    args = list(args)
    i = 0
    while i < len(args):
        tok = args[i]
        name, _, inline = tok.partition("=")
        if name not in WRAPPER_FLAGS:
            known = ", ".join(sorted(WRAPPER_FLAGS))
            raise WrapperError(f"{where}: unknown option {tok!r} (known: {known})")
        fld, kind = WRAPPER_FLAGS[name]
        if kind in ("true", "false"):
            if inline:
                raise WrapperError(f"{where}: {name} takes no value")
            out[fld] = kind == "true"
            i += 1
            continue
        if inline or "=" in tok:
            value = inline
        else:
            if i + 1 >= len(args):
                raise WrapperError(f"{where}: {name} needs a value")
            value = args[i + 1]
            i += 1
        i += 1
        if kind == "int":
            try:
                out[fld] = int(value)
            except ValueError:
                raise WrapperError(f"{where}: {name} expects an integer, got {value!r}") from None
        elif kind == "list":
            out.setdefault(fld, [])
            out[fld].append(value)
        else:
            out[fld] = value
    return out


def check_options(opts: WrapperOptions) -> WrapperOptions:
    """Validate ranges and normalise the signal name; WrapperError naming the bad value."""
    for name, unit in (("grace", " seconds"), ("max_restarts", ""), ("spare_nodes", ""),
                       ("hang_after_fault", " seconds"), ("watchdog", " seconds")):
        low, high = limits(name)
        if not low <= getattr(opts, name) <= high:
            raise WrapperError(f"--{name.replace('_', '-')} {getattr(opts, name)}: must be between {low} and "
                               f"{high}{unit}")
    sig, grace = parse_signal_spec(opts.signal)
    opts = replace(opts, signal=sig, grace=grace if grace is not None else opts.grace)
    for url in opts.notify:
        if not url.startswith(("http://", "https://")):
            raise WrapperError(f"--notify {url!r}: must be an http:// or https:// URL")
        _refuse_control(url, "--notify")
    if opts.preload:
        from autoheal.sbatch_helpers.warm import parse_preload

        try:
            opts = replace(opts, preload=",".join(parse_preload(opts.preload)))
        except ValueError as exc:
            raise WrapperError(f"--preload {opts.preload!r}: {exc}") from None
    _refuse_control(opts.checkpoint_dir, "--checkpoint-dir")
    _refuse_control(opts.python, "sbatch.python")
    return opts


def merge_options(defaults: WrapperOptions, *layers: Dict[str, Any]) -> WrapperOptions:
    """Apply override layers in order (later wins); ``notify`` lists accumulate."""
    merged = replace(defaults, notify=list(defaults.notify))
    for layer in layers:
        for key, value in layer.items():
            if value is None:
                continue
            if key == "signal":
                sig, grace = parse_signal_spec(str(value))
                merged.signal = sig
                if grace is not None:
                    merged.grace = grace
            elif key == "notify":
                merged.notify.extend(v for v in value if v not in merged.notify)
            else:
                setattr(merged, key, value)
    return merged


def defaults_from_config(section: Optional[SbatchSection]) -> WrapperOptions:
    """WrapperOptions from a config ``[sbatch]`` section (or None: built-in defaults)."""
    if section is None:
        return WrapperOptions()
    return WrapperOptions(grace=section.grace, signal=section.signal, max_restarts=section.max_restarts,
                          checkpoint_dir=section.checkpoint_dir, exclude_failed=section.exclude_failed,
                          requeue_margin=section.requeue_margin, python=section.python,
                          spare_nodes=section.spare_nodes, hang_after_fault=section.hang_after_fault,
                          watchdog=section.watchdog)


# ---- the plan ------------------------------------------------------------------------------------


@dataclass
class SubmitRequest:
    """Everything the CLI collected, before merging."""

    script_path: Optional[str]  # None with --wrap
    script_text: str
    script_args: List[str]
    sbatch_args: List[str]  # the user's sbatch options from the command line
    cli_overrides: Dict[str, Any] = field(default_factory=dict)
    defaults: WrapperOptions = field(default_factory=WrapperOptions)
    python: str = "python3"
    sbatch: str = "sbatch"
    config_path: Optional[str] = None
    token: Optional[str] = None  # the submission's token; None: a new random one


def new_token() -> str:
    """A fresh submission token: 10 hex digits (the job id tells jobs apart; this tells apart two jobs
    that got the same id, e.g. after the cluster's job counter was reset)."""
    return secrets.token_hex(5)


@dataclass
class SubmitPlan:
    """What ``autoheal sbatch`` will run: argv (script on stdin) and the generated batch script."""

    argv: List[str]
    script: str
    options: WrapperOptions
    warnings: List[str] = field(default_factory=list)
    parsable: bool = False
    token: str = ""

    def to_dict(self) -> Dict[str, Any]:
        from dataclasses import asdict

        return {"argv": self.argv, "script": self.script, "options": asdict(self.options),
                "warnings": self.warnings, "stdin": "script", "submit_token": self.token}

    def render(self) -> str:
        """Human dry-run output: the command and the script, ready to review or copy."""
        lines = ["# sbatch command (the generated batch script below is passed on stdin):",
                 " ".join(shell_word(a, display=True) for a in self.argv), "", "# generated batch script:"]
        out = "\n".join(lines) + "\n" + self.script
        for w in self.warnings:
            out += f"# warning: {sanitize(w, 500)}\n"
        return out


def _has(opts: Sequence[SbatchOption], *names: str) -> Optional[SbatchOption]:
    found = None
    for o in opts:
        if o.name in names:
            found = o  # last one wins, as in sbatch
    return found


def _delimiter(text: str) -> str:
    base = "AUTOHEAL_USER_SCRIPT_" + hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()[:8].upper()
    delim, n = base, 0
    lines = set(text.split("\n"))  # bash ends the here-document at a line equal to delim, lines split on \n
    while delim in lines:
        n += 1
        delim = f"{base}_{n}"
    return delim


def build_plan(req: SubmitRequest) -> SubmitPlan:
    """Merge settings, check conflicts, and produce the sbatch argv and the generated script."""
    if req.script_path is not None:
        _refuse_control(req.script_path, "script path")
    token = req.token if req.token is not None else new_token()
    if not TOKEN_PATTERN.match(token):
        raise WrapperError(f"submission token {show(token)}: use 1-64 letters, digits, '.', '_' or '-'")
    where = req.script_path or "--wrap"
    parsed = parse_script(req.script_text, where)
    cli_opts, rest = parse_sbatch_options(req.sbatch_args, stop_at_positional=True)
    if rest:
        raise WrapperError(f"unexpected argument {rest[0]!r} before the script")
    all_opts = parsed.sbatch_options + cli_opts
    warnings: List[str] = []
    _refuse_conflicts(all_opts)
    script_layer = _script_layer(parsed, cli_opts, warnings)
    autoheal_layer = parse_wrapper_args(parsed.autoheal_args, f"{where}: #AUTOHEAL")
    opts = check_options(merge_options(req.defaults, script_layer, autoheal_layer, req.cli_overrides))
    if not opts.checkpoint_dir:  # unique per job: a new job that gets an old job id gets another folder
        opts = replace(opts, checkpoint_dir=DEFAULT_CHECKPOINT_DIR.format(token=token))
    active_nodes = _active_nodes(all_opts, opts.spare_nodes, warnings, opts.min_nodes)
    argv = _sbatch_argv(req, all_opts, cli_opts, opts, active_nodes)
    return SubmitPlan(argv=argv, script=generate_script(req, parsed, opts, token, active_nodes), options=opts,
                      warnings=warnings, parsable=bool(_has(cli_opts, "parsable")), token=token)


def _refuse_conflicts(all_opts: Sequence[SbatchOption]) -> None:
    """sbatch options that would break requeue-and-resume (the script's and the command line's)."""
    if _has(all_opts, "no-requeue"):
        raise WrapperError("--no-requeue conflicts with autoheal sbatch, which requeues the job to resume it; "
                           "remove it (or submit with plain sbatch)")
    mode = _has(all_opts, "open-mode")
    if mode and (mode.value or "").lower() != "append":
        raise WrapperError(f"--open-mode={mode.value} conflicts with requeueing: a restarted job would "
                           f"truncate its output; remove it (autoheal sbatch uses --open-mode=append)")
    rq = _has(all_opts, "requeue")
    if rq and rq.value and rq.value.lower() not in ("expedite",):
        raise WrapperError(f"--requeue={rq.value}: unknown value")


def _script_layer(parsed: ParsedScript, cli_opts: Sequence[SbatchOption], warnings: List[str]) -> Dict[str, Any]:
    """The wrapper settings the script's own ``#SBATCH --signal`` gives (a batch-shell signal is kept)."""
    script_layer: Dict[str, Any] = {}
    user_signal = _has(parsed.sbatch_options, "signal")
    if user_signal and user_signal.value:
        if user_signal.value.upper().startswith(("B:", "RB:", "BR:")):
            script_layer["signal"] = user_signal.value
        else:
            warnings.append(f"the script's --signal={user_signal.value} is replaced by the batch-shell signal; "
                            f"the runner forwards it to every step")
    if _has(cli_opts, "signal"):
        raise WrapperError("give the grace signal as a wrapper option before sbatch options: "
                           "autoheal sbatch --signal USR2 --grace 90 ... (or #AUTOHEAL --signal ...)")
    return script_layer


def _sbatch_argv(req: SubmitRequest, all_opts: Sequence[SbatchOption], cli_opts: Sequence[SbatchOption],
                 opts: WrapperOptions, active_nodes: int) -> List[str]:
    """sbatch's argv: requeue, append, the grace signal, the runner comment, then the user's options."""
    comment_opt = _has(all_opts, "comment")
    comment = MARKER
    if comment_opt and comment_opt.value:
        # the runner rewrites the comment as one line: keep the user's part one line from the start
        comment = sanitize(f"{MARKER}{COMMENT_SEPARATOR}{comment_opt.value}", MAX_COMMENT_LEN)
    rq = _has(all_opts, "requeue")
    argv = [req.sbatch]
    if not rq or not rq.value:
        argv.append("--requeue")
    argv += ["--open-mode=append", f"--signal=B:{opts.signal}@{opts.grace}", f"--comment={comment}"]
    if not _has(all_opts, "job-name"):
        name = Path(req.script_path).name if req.script_path else "wrap"
        argv.append(f"--job-name={name}")
    if opts.spare_nodes:
        # on the command line: wins over the script's #SBATCH --nodes, as in sbatch
        argv.append(f"--nodes={active_nodes + opts.spare_nodes}")
        if not _has(all_opts, "no-kill"):
            argv.append("--no-kill")
    for o in cli_opts:
        if o.name in ("comment", "wrap") or (opts.spare_nodes and o.name == "nodes"):
            continue
        argv.extend(o.tokens)
    return argv


def _active_nodes(opts: Sequence[SbatchOption], spare_nodes: int, warnings: List[str], min_nodes: int = 0) -> int:
    """With hot spares: the node count the user asked for (one number; 1 when not given). The job asks
    sbatch for that many plus the spares; the runner keeps the spares idle."""
    if not spare_nodes:
        if min_nodes:
            raise WrapperError("--min-nodes goes with --spare-nodes (the elastic fallback once the spares are "
                               "used up); give --spare-nodes 1 or more")
        return 0
    nodes = _has(opts, "nodes")
    value = (nodes.value or "").strip() if nodes else "1"
    if not value.isdigit() or int(value) < 1:
        raise WrapperError(f"--spare-nodes needs a fixed node count, not --nodes={value} (a range or list "
                           f"would leave the runner guessing which nodes are spares)")
    if min_nodes and not 1 <= min_nodes <= int(value):
        raise WrapperError(f"--min-nodes {min_nodes}: must be between 1 and the job's --nodes ({value})")
    if _has(opts, "ntasks") and not _has(opts, "ntasks-per-node"):
        warnings.append("--spare-nodes with --ntasks but no --ntasks-per-node: sbatch spreads the tasks over "
                        "the spares too; give --ntasks-per-node so each step runs its tasks on the active nodes")
    return int(value)


def runner_argv(opts: WrapperOptions, active_nodes: int = 0) -> List[str]:
    """The runner's options (the script path and the user's arguments follow)."""
    argv = ["--grace", str(opts.grace), "--signal", opts.signal, "--max-restarts", str(opts.max_restarts),
            "--requeue-margin", str(opts.requeue_margin),
            "--exclude-failed" if opts.exclude_failed else "--no-exclude-failed"]
    if opts.checkpoint_dir:
        argv += ["--checkpoint-dir", opts.checkpoint_dir]
    # Only when not the built-in default (the runner's own): a script generated here still runs under a
    # runner of the release before hang detection on nodes not yet upgraded.
    for flag, name in (("--hang-after-fault", "hang_after_fault"), ("--watchdog", "watchdog")):
        if getattr(opts, name) != getattr(_CONFIG_DEFAULTS, name):
            argv += [flag, str(getattr(opts, name))]
    for url in opts.notify:
        argv += ["--notify", url]
    if opts.preload:
        argv += ["--preload", opts.preload]
    if opts.spare_nodes and active_nodes:
        argv += ["--spare-nodes", str(opts.spare_nodes), "--active-nodes", str(active_nodes)]
        if opts.min_nodes:
            argv += ["--min-nodes", str(opts.min_nodes)]
    return argv


def generate_script(req: SubmitRequest, parsed: ParsedScript, opts: WrapperOptions, token: str = "",
                    active_nodes: int = 0) -> str:
    """The batch script sbatch stores: the user's #SBATCH header, the embedded script, exec of the runner.

    Outside the here-document every line is ours, and every string in it is one :func:`shell_word`.
    """
    text = parsed.text if parsed.text.endswith("\n") else parsed.text + "\n"
    delim = _delimiter(text)
    python = opts.python or req.python
    src = shell_word(req.script_path, display=True) if req.script_path else "sbatch --wrap"
    lines = ["#!/bin/bash", *parsed.sbatch_lines,
             f"# Generated by `autoheal sbatch` from {src}. The #SBATCH lines above are the script's own;",
             "# the job runner runs the script (embedded below as it was at submission) as a child, forwards",
             "# the grace signal to it, and requeues the job to resume from its newest valid checkpoint."]
    if req.config_path:
        lines.append(f"export AUTOHEAL_CONFIG={shell_word(req.config_path)}")
    if token:
        if not TOKEN_PATTERN.match(token):
            raise WrapperError(f"submission token {show(token)}: use 1-64 letters, digits, '.', '_' or '-'")
        lines.append(f"export {TOKEN_ENV}={token}  # this submission: names its checkpoint folder and owns "
                     f"its checkpoints")
    if opts.allow_foreign_checkpoint:
        lines.append(f"export {ALLOW_FOREIGN_ENV}=1  # may resume checkpoints of an earlier job with this id")
    lines += [
        'autoheal_script="$(mktemp "${TMPDIR:-/tmp}/autoheal-job-${SLURM_JOB_ID:-0}.XXXXXX")" || exit 1',
        f"cat > \"$autoheal_script\" <<'{delim}'",
    ]
    body = text + delim + "\n"
    tail = [
        'chmod 700 "$autoheal_script"',
        "exec " + " ".join(shell_word(a) for a in [python, "-m", RUNNER_MODULE, *runner_argv(opts, active_nodes)])
        + ' --script "$autoheal_script" --' + "".join(" " + shell_word(a) for a in req.script_args),
    ]
    return "\n".join(lines) + "\n" + body + "\n".join(tail) + "\n"


def wrap_script(command: str) -> str:
    """The script sbatch --wrap would build for ``command``."""
    return f"#!/bin/sh\n# This script was created by sbatch --wrap.\n\n{command}\n"


def read_script(path: str) -> str:
    """The user's script text; WrapperError (one line) when missing, unreadable or not text."""
    p = Path(path)
    name = show(str(path))
    if not p.exists():
        raise WrapperError(f"script {name}: not found")
    if p.is_dir():
        raise WrapperError(f"script {name}: is a directory")
    if not p.is_file():  # a FIFO would block the read forever, a device would never end
        raise WrapperError(f"script {name}: is not a regular file")
    if not os.access(p, os.R_OK):
        raise WrapperError(f"script {name}: not readable (permission denied)")
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise WrapperError(f"script {name}: cannot read: {exc.strerror}") from None
    if b"\x00" in data:
        raise WrapperError(f"script {name}: is binary, not a batch script")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise WrapperError(f"script {name}: is not UTF-8 text") from None


def split_command_line(args: Sequence[str]) -> Tuple[List[str], Dict[str, Any], Optional[str], List[str]]:
    """``[sbatch and wrapper options] SCRIPT [ARGS]`` -> (sbatch args, wrapper overrides, script, args).

    Wrapper options may also appear among the sbatch options (before SCRIPT).
    """
    sbatch_args: List[str] = []
    wrapper_tokens: List[str] = []
    args = list(args)
    i = 0
    while i < len(args):
        tok = args[i]
        name = tok.split("=", 1)[0]
        if name in WRAPPER_FLAGS:
            kind = WRAPPER_FLAGS[name][1]
            if kind in ("true", "false") or "=" in tok:
                wrapper_tokens.append(tok)
            else:
                wrapper_tokens.extend(args[i:i + 2])
                i += 1
            i += 1
            continue
        try:
            opts, _ = parse_sbatch_options([tok], stop_at_positional=True)
        except WrapperError:  # an option that takes its value from the next argument
            opts, _ = parse_sbatch_options(args[i:i + 2], stop_at_positional=True)
        if not opts:
            if tok == "--":
                i += 1
            break
        consumed = len(opts[0].tokens)
        sbatch_args.extend(args[i:i + consumed])
        i += consumed
    script = args[i] if i < len(args) else None
    return sbatch_args, parse_wrapper_args(wrapper_tokens, "command line"), script, args[i + 1:]
