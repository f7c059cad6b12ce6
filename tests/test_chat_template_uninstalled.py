"""The chat-template renderer's child process finds the project when it runs from a checkout that is not
pip-installed (PYTHONPATH=checkout, as on a machine the wheels are carried to): the child starts with -I,
which drops PYTHONPATH, so it must put the directory that holds the hipcore package on its path itself."""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig

from hipcore.tokenizer import chat_template


def test_the_renderer_child_imports_hipcore_from_an_uninstalled_checkout(tmp_path):
    request = json.dumps({"template": "<{{ messages[0]['content'] }}>", "timeout_s": 2.0, "max_chars": 1000,
                          "context": {"messages": [{"role": "user", "content": "hi"}]}})
    # -S: no site processing, so no .pth file (this venv's editable install of the project) takes effect; the
    # installed packages (jinja2) stay reachable through the plain directory. Only the child's own path
    # entry (argv[1]) can then make hipcore importable, as in a checkout that was never installed.
    boot = f"import sys; sys.path.append({sysconfig.get_paths()['purelib']!r}); " + chat_template._CHILD_BOOT
    done = subprocess.run([sys.executable, "-S", "-c", boot, chat_template._PROJECT_ROOT], input=request,
                          capture_output=True, text=True, timeout=60,
                          cwd=tmp_path)  # not the checkout: -c puts the working directory on the path
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout) == {"text": "<hi>"}
