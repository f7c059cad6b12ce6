"""A leak check's findings and the verdict and exit code they give, shared by leak-check's LeakReport and
serve-leak-check's ServeLeakReport."""

from __future__ import annotations

from dataclasses import dataclass

EXIT_CLEAN, EXIT_LEAK, EXIT_INTERRUPTED = 0, 1, 130  # 130: 128 + SIGINT, as shells report Ctrl-C
LEAK, WARNING, NOT_JUDGED = "leak", "warning", "not judged"
INTERRUPTED = "interrupted, no verdict"


@dataclass
class Finding:
    layer: str
    severity: str  # "leak" fails the run; "warning" does not
    message: str

    def to_dict(self) -> dict:
        return {"layer": self.layer, "severity": self.severity, "message": self.message}


class FindingsVerdict:
    """The verdict and exit code a report's findings give (leak-check's LeakReport, serve-leak-check's ServeLeakReport)."""

    findings: list[Finding]
    interrupted: bool

    @property
    def leaked(self) -> bool:
        return any(f.severity == LEAK for f in self.findings)

    @property
    def not_judged(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == NOT_JUDGED]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == WARNING]

    @property
    def verdict(self) -> str:
        if self.interrupted:
            return INTERRUPTED
        return "leak" if self.leaked else NOT_JUDGED if self.not_judged else "clean"

    @property
    def exit_code(self) -> int:
        if self.interrupted:
            return EXIT_INTERRUPTED
        return EXIT_LEAK if self.leaked or self.not_judged else EXIT_CLEAN
