"""Regular expressions compiled on first use.

Compiling a pattern runs ``re``'s parser and compiler in Python (0.1-1.6 ms each on a lab node); the
hooks import modules whose patterns a healthy pass never uses (the config's value checkers, the kernel
log's XID lines when no line is new, reason parsing). Slurm starts the hooks as fresh processes every
``HealthCheckInterval`` and around every job, so those compiles were paid every time (issue 24
section 6). A ``LazyPattern`` has the methods of a compiled pattern that the code uses.
"""

from __future__ import annotations

import re

TYPE_CHECKING = False  # typing is for mypy only: not imported at run time (the hooks start fast)
if TYPE_CHECKING:
    from typing import Iterator, List, Optional, Union


class LazyPattern:
    """``re.compile(pattern, flags)``, done on the first match; a race compiles twice, harmlessly."""

    __slots__ = ("_compiled", "flags", "pattern")

    def __init__(self, pattern: str, flags: Union[int, re.RegexFlag] = 0) -> None:
        self.pattern = pattern
        self.flags = flags
        self._compiled: Optional[re.Pattern[str]] = None

    @property
    def compiled(self) -> re.Pattern[str]:
        if self._compiled is None:
            self._compiled = re.compile(self.pattern, self.flags)
        return self._compiled

    def match(self, text: str) -> Optional[re.Match[str]]:
        return self.compiled.match(text)

    def fullmatch(self, text: str) -> Optional[re.Match[str]]:
        return self.compiled.fullmatch(text)

    def search(self, text: str) -> Optional[re.Match[str]]:
        return self.compiled.search(text)

    def finditer(self, text: str) -> Iterator[re.Match[str]]:
        return self.compiled.finditer(text)

    def sub(self, repl: str, text: str, count: int = 0) -> str:
        return self.compiled.sub(repl, text, count)

    def split(self, text: str, maxsplit: int = 0) -> List[str]:
        return self.compiled.split(text, maxsplit)
