"""Which kernel entries a test's launches went to: each launcher module's get_kernel wrapped to note them."""

from __future__ import annotations


def record_entries(monkeypatch, *modules) -> list[str]:
    """Wrap each module's get_kernel (monkeypatch undoes it) so that every kernel it hands out appends its entry
    name to the returned list."""
    entries: list[str] = []
    for module in modules:
        real = module.get_kernel

        def recording(device, op, name, *args, real=real, **kwargs):
            entries.append(name)
            return real(device, op, name, *args, **kwargs)

        monkeypatch.setattr(module, "get_kernel", recording)
    return entries
