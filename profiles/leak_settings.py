"""The settings of a leak-check run: validated, printable as the exact command that reproduces it."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from hipcore.errors import UsageError
from profiles import leak_bugs
from profiles.leak_thresholds import Thresholds
from profiles.leak_workload import WorkloadShape


DEADLINE_BASE_SECONDS = 300
DEADLINE_SECONDS_PER_REQUEST = 5


@dataclass(frozen=True)
class LeakCheckSettings:
    model: str
    device: str = "auto"
    requests: int = 1000
    parallel: int = 8
    seed: int = 0
    kv_blocks: int | None = None  # None: deliberately small (WorkloadShape.default_kv_blocks)
    max_tokens: int = 12
    prompt_tokens: tuple[int, int] = (4, 32)
    step_tokens: int = 32
    phases: int = 4
    warmup: int | None = None  # None: `parallel` requests
    finished_bound: int = 100
    kv_dtype: str = "f16"
    block_size: int = 16
    tracemalloc: bool = True
    thresholds: Thresholds = field(default_factory=Thresholds)
    planted_bug: str | None = None
    deadline: float | None = None  # seconds from the warm-up on; None: deadline_seconds()'s default
    prefix_caching: bool = True  # as serve runs: cached blocks, and prompts that share prefixes (leak_workload)

    def deadline_seconds(self) -> float:
        """The run ends as failed past this (a leak that keeps steps busy without progress must end
        it). The default is generous: about 5x what the cpu backend needs per request on two cores."""
        if self.deadline is not None:
            return self.deadline
        return DEADLINE_BASE_SECONDS + DEADLINE_SECONDS_PER_REQUEST * (self.requests + self.warmup_requests)

    def shape(self) -> WorkloadShape:
        return WorkloadShape(seed=self.seed, max_tokens=self.max_tokens, prompt_min=self.prompt_tokens[0],
                             prompt_max=self.prompt_tokens[1], step_tokens=self.step_tokens, block_size=self.block_size,
                             parallel=self.parallel, shared_prefixes=self.prefix_caching)

    @property
    def warmup_requests(self) -> int:
        return self.parallel if self.warmup is None else self.warmup

    def validate(self) -> None:
        checks = [
            (self.requests >= 1, f"--requests must be at least 1, got {self.requests}"),
            (self.parallel >= 1, f"--parallel must be at least 1, got {self.parallel}"),
            (self.seed >= 0, f"--seed must be >= 0, got {self.seed}"),
            (self.kv_blocks is None or self.kv_blocks >= 1, f"--kv-blocks must be at least 1, got {self.kv_blocks}"),
            (1 <= self.phases <= self.requests, f"--phases must be between 1 and --requests ({self.requests}), got {self.phases}"),
            (self.warmup is None or self.warmup >= 0, f"--warmup must be >= 0, got {self.warmup}"),
            (self.finished_bound >= 1, f"--finished-bound must be at least 1, got {self.finished_bound}"),
            (self.block_size >= 1, f"--block-size must be at least 1, got {self.block_size}"),
            (self.deadline is None or self.deadline > 0, f"--deadline must be more than 0 seconds, got {self.deadline}"),
        ]
        for ok, message in checks:
            if not ok:
                raise UsageError(message)
        self.shape().validate()
        if self.planted_bug is not None:
            leak_bugs.check_allowed(self.planted_bug)

    def command_line(self) -> str:
        """The command that reproduces this run exactly (every setting spelled out)."""
        t = self.thresholds.describe()
        parts = ["rocmforge", "leak-check", "--model", self.model, "--device", self.device, "--requests", str(self.requests),
                 "--parallel", str(self.parallel), "--seed", str(self.seed), "--max-tokens", str(self.max_tokens),
                 "--prompt-tokens", f"{self.prompt_tokens[0]}-{self.prompt_tokens[1]}", "--step-tokens", str(self.step_tokens),
                 "--phases", str(self.phases), "--warmup", str(self.warmup_requests), "--finished-bound", str(self.finished_bound),
                 "--kv-dtype", self.kv_dtype, "--block-size", str(self.block_size)]
        if self.kv_blocks is not None:
            parts += ["--kv-blocks", str(self.kv_blocks)]
        if self.deadline is not None:
            parts += ["--deadline", f"{self.deadline:g}"]
        if not self.tracemalloc:
            parts.append("--no-tracemalloc")
        if not self.prefix_caching:
            parts.append("--no-prefix-cache")
        for key, value in self.thresholds.to_dict().items():
            if value != getattr(Thresholds(), key):
                cli_key = {"host_growth_per_1000": "host-growth", "host_traced_per_1000": "host-traced"}.get(key, key)
                shown = t[cli_key].replace(" (warning only)", "").replace(" ", "")
                parts += ["--fail-on", f"{cli_key}={shown}"]
        if self.planted_bug:
            parts = ["ROCMFORGE_TESTING=1"] + parts + ["--plant-bug", self.planted_bug]
        return " ".join(shlex.quote(p) for p in parts)

    def to_dict(self) -> dict:
        return {
            "model": self.model, "device": self.device, "requests": self.requests, "parallel": self.parallel,
            "seed": self.seed, "kv_blocks": self.kv_blocks, "max_tokens": self.max_tokens,
            "prompt_tokens": list(self.prompt_tokens), "step_tokens": self.step_tokens, "phases": self.phases,
            "warmup": self.warmup_requests, "finished_bound": self.finished_bound, "kv_dtype": self.kv_dtype,
            "block_size": self.block_size, "deadline_seconds": self.deadline_seconds(),
            "tracemalloc": self.tracemalloc, "prefix_caching": self.prefix_caching, "thresholds": self.thresholds.to_dict(),
        }
