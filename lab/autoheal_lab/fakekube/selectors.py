"""Label and field selectors with the syntax and matching rules of k8s.io/apimachinery.

Label selectors: ``k=v``, ``k==v``, ``k!=v``, ``k in (a,b)``, ``k notin (a,b)``, ``k``,
``!k``, ``k>1``, ``k<1``; also built from a ``metav1.LabelSelector`` dict.
Field selectors: ``f=v``, ``f==v``, ``f!=v`` joined by commas, ``\\`` escapes.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple


class SelectorError(ValueError):
    pass


_NAME_RE = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_DNS1123_SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def label_key_problem(key: str) -> Optional[str]:
    """Why ``key`` is not a valid qualified name, or None."""
    prefix, _, name = key.rpartition("/")
    if "/" in key and not prefix:
        return "prefix part must be non-empty"
    if prefix and (len(prefix) > 253 or not _DNS1123_SUBDOMAIN_RE.match(prefix)):
        return "prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric " \
               "characters, '-' or '.', and must start and end with an alphanumeric character"
    if not name:
        return "name part must be non-empty"
    if len(name) > 63:
        return "name part must be no more than 63 characters"
    if not _NAME_RE.match(name):
        return "name part must consist of alphanumeric characters, '-', '_' or '.', and must start " \
               "and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', " \
               "regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
    return None


def label_value_problem(value: str) -> Optional[str]:
    if value == "":
        return None
    if len(value) > 63:
        return "must be no more than 63 characters"
    if not _NAME_RE.match(value):
        return "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' " \
               "or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or " \
               "'my_value',  or '12345', regex used for validation is " \
               "'(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
    return None


class Requirement:
    __slots__ = ("key", "op", "values")

    def __init__(self, key: str, op: str, values: Sequence[str] = ()):
        self.key = key
        self.op = op
        self.values = tuple(values)

    def matches(self, labels: Mapping[str, str]) -> bool:
        has = self.key in labels
        val = labels.get(self.key)
        if self.op == "exists":
            return has
        if self.op == "!":
            return not has
        if self.op in ("=", "==", "in"):
            return has and val in self.values
        if self.op in ("!=", "notin"):
            return not has or val not in self.values
        if self.op in (">", "<"):
            if not has:
                return False
            try:
                lhs = int(val)  # type: ignore[arg-type]
            except ValueError:
                return False
            rhs = int(self.values[0])
            return lhs > rhs if self.op == ">" else lhs < rhs
        raise AssertionError(self.op)

    def __repr__(self) -> str:
        return f"Requirement({self.key!r}, {self.op!r}, {self.values!r})"


class LabelSelector:
    """A conjunction of requirements; ``nothing`` matches no object at all."""

    def __init__(self, requirements: Sequence[Requirement] = (), nothing: bool = False):
        self.requirements = tuple(requirements)
        self.nothing = nothing

    @property
    def empty(self) -> bool:
        return not self.requirements and not self.nothing

    def matches(self, labels: Optional[Mapping[str, str]]) -> bool:
        if self.nothing:
            return False
        labels = labels or {}
        return all(r.matches(labels) for r in self.requirements)


_SPECIAL = "!=(),<>"


def _lex(text: str) -> List[str]:
    tokens: List[str] = []
    i = 0
    while i < len(text):
        c = text[i]
        if c.isspace():
            i += 1
        elif text.startswith("!=", i) or text.startswith("==", i):
            tokens.append(text[i:i + 2])
            i += 2
        elif c in _SPECIAL:
            tokens.append(c)
            i += 1
        else:
            j = i
            while j < len(text) and not text[j].isspace() and text[j] not in _SPECIAL:
                j += 1
            tokens.append("\0" + text[i:j])  # identifiers are marked so "in" the word differs from punctuation
            i = j
    return tokens


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.toks = _lex(text)
        self.pos = 0

    def peek(self) -> Optional[str]:
        return self.toks[self.pos] if self.pos < len(self.toks) else None

    def take(self) -> Optional[str]:
        tok = self.peek()
        self.pos += 1
        return tok

    def fail(self, what: str) -> SelectorError:
        what = what.replace("\\x00", "")
        return SelectorError(f"unable to parse requirement: {what} in selector {self.text!r}")

    def ident(self) -> str:
        tok = self.take()
        if tok is None or not tok.startswith("\0"):
            raise self.fail(f"found {tok!r}, expected: identifier")
        return tok[1:]

    def requirement(self) -> Requirement:
        if self.peek() == "!":
            self.take()
            key = self.ident()
            _check_key(key)
            return Requirement(key, "!")
        key = self.ident()
        _check_key(key)
        tok = self.peek()
        if tok is None or tok == ",":
            return Requirement(key, "exists")
        self.take()
        word = tok[1:] if tok.startswith("\0") else None
        if word in ("in", "notin"):
            if self.take() != "(":
                raise self.fail("found no '(' after set operator")
            values: List[str] = []
            while True:
                nxt = self.peek()
                if nxt is not None and nxt.startswith("\0"):
                    values.append(self.take()[1:])  # type: ignore[index]
                    nxt = self.peek()
                if nxt == ",":
                    self.take()
                elif nxt == ")":
                    self.take()
                    break
                else:
                    raise self.fail(f"found {nxt!r}, expected: ',', ')' or identifier")
            if not values:
                raise self.fail("for 'in', 'notin' operators, values set can't be empty")
            for v in values:
                _check_value(v)
            return Requirement(key, word, values)
        if tok in ("=", "==", "!="):
            nxt = self.peek()
            value = ""
            if nxt is not None and nxt.startswith("\0"):
                value = self.take()[1:]  # type: ignore[index]
            _check_value(value)
            return Requirement(key, tok, (value,))
        if tok in (">", "<"):
            value = self.ident()
            if not re.fullmatch(r"-?\d+", value):
                raise self.fail(f"for 'Gt', 'Lt' operators, the value must be an integer: {value!r}")
            return Requirement(key, tok, (value,))
        raise self.fail(f"found {tok!r}, expected: in, notin, =, ==, !=, gt, lt")


def _check_key(key: str) -> None:
    problem = label_key_problem(key)
    if problem:
        raise SelectorError(f"unable to parse requirement: key: Invalid value: {key!r}: {problem}")


def _check_value(value: str) -> None:
    problem = label_value_problem(value)
    if problem:
        raise SelectorError(f"unable to parse requirement: values[0]: Invalid value: {value!r}: {problem}")


def parse_label_selector(text: Optional[str]) -> LabelSelector:
    """Parse the string form (``labelSelector`` query parameter)."""
    if text is None or not text.strip():
        return LabelSelector()
    p = _Parser(text)
    reqs = [p.requirement()]
    while p.peek() is not None:
        if p.take() != ",":
            raise p.fail("expected ','")
        reqs.append(p.requirement())
    return LabelSelector(reqs)


def label_selector_from_dict(sel: Optional[Mapping[str, Any]]) -> LabelSelector:
    """Convert a ``metav1.LabelSelector``; None selects nothing, ``{}`` selects everything."""
    if sel is None:
        return LabelSelector(nothing=True)
    reqs = [Requirement(k, "=", (v,)) for k, v in sorted((sel.get("matchLabels") or {}).items())]
    ops = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!"}
    for expr in sel.get("matchExpressions") or []:
        op = ops.get(expr.get("operator"))
        if op is None:
            raise SelectorError(f"{expr.get('operator')!r} is not a valid label selector operator")
        values = tuple(expr.get("values") or ())
        if op in ("in", "notin") and not values:
            raise SelectorError("for 'in', 'notin' operators, values set can't be empty")
        if op in ("exists", "!") and values:
            raise SelectorError("values set must be empty for exists and does not exist")
        reqs.append(Requirement(expr.get("key", ""), op, values))
    return LabelSelector(reqs)


# -- field selectors ---------------------------------------------------------------------------

FieldTerm = Tuple[str, str, str]  # (field, op, value) with op "=" or "!="


def _split_unescaped(text: str, sep: str) -> List[str]:
    parts, cur, i = [], [], 0
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text):
            cur.append(text[i:i + 2])
            i += 2
            continue
        if c == sep:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(c)
        i += 1
    parts.append("".join(cur))
    return parts


def _unescape(value: str) -> str:
    out, i = [], 0
    while i < len(value):
        c = value[i]
        if c == "\\":
            if i + 1 >= len(value) or value[i + 1] not in "\\,=":
                raise SelectorError(f"invalid field selector: invalid escape sequence in {value!r}")
            out.append(value[i + 1])
            i += 2
            continue
        if c in ",=":
            raise SelectorError(f"invalid field selector: unescaped {c!r} in {value!r}")
        out.append(c)
        i += 1
    return "".join(out)


def parse_field_selector(text: Optional[str]) -> List[FieldTerm]:
    if text is None or not text.strip():
        return []
    terms: List[FieldTerm] = []
    for part in _split_unescaped(text, ","):
        if not part:
            continue
        for op in ("!=", "==", "="):
            idx = part.find(op)
            if idx > 0:
                field_name = part[:idx].strip()
                value = _unescape(part[idx + len(op):])
                terms.append((field_name, "!=" if op == "!=" else "=", value))
                break
        else:
            raise SelectorError(f"invalid selector: '{text}'; can't understand '{part}'")
    return terms


def field_value(obj: Mapping[str, Any], path: str) -> str:
    """The string a field selector compares against: booleans as true/false, missing as ''."""
    cur: Any = obj
    for part in path.split("."):
        if not isinstance(cur, Mapping):
            return ""
        cur = cur.get(part)
    if cur is None:
        return ""
    if isinstance(cur, bool):
        return "true" if cur else "false"
    return str(cur)


def field_selector_matches(terms: Sequence[FieldTerm], obj: Mapping[str, Any]) -> bool:
    for name, op, value in terms:
        actual = field_value(obj, name)
        if (actual == value) != (op == "="):
            return False
    return True


def labels_of(obj: Mapping[str, Any]) -> Dict[str, str]:
    return ((obj.get("metadata") or {}).get("labels")) or {}
