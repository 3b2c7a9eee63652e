"""The shell commands of README.md's sections, read from the README itself (not a copy), and a shell to
run them in as a new user would: no virtualenv activated, no SPARK_HOME, PYSPARK_* or PYTHONPATH.

Tests substitute only the master URL and paths (:func:`substitute`) before running a command, so a
README that changes its commands changes what the tests run."""

from __future__ import annotations

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
README = os.path.join(ROOT, "README.md")
_FENCE = re.compile(r"^```bash\n(.*?)^```", re.S | re.M)
_PYTHON = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def section(title: str, text: str | None = None) -> str:
    """The README's ``## title...`` section (up to the next ``## ``)."""
    if text is None:
        with open(README) as f:
            text = f.read()
    parts = re.split(r"^## ", text, flags=re.M)
    found = [p for p in parts[1:] if p.startswith(title)]
    if len(found) != 1:
        raise AssertionError(f"README.md has {len(found)} sections titled {title!r}")
    return found[0]


def commands(title: str, text: str | None = None) -> list[str]:
    """Every shell command in the ```bash blocks of section ``title``: continuation lines joined,
    comments and blank lines dropped."""
    out = []
    for block in _FENCE.findall(section(title, text)):
        joined = re.sub(r"[ \t]*\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = re.sub(r"(^|\s)#.*$", "", line).strip()
            if line:
                out.append(line)
    return out


def python(title: str, text: str | None = None) -> str:
    """The ```python blocks of section ``title``, joined: what a reader would paste."""
    return "\n".join(_PYTHON.findall(section(title, text)))


def substitute(command: str, replacements: dict[str, str]) -> str:
    """``command`` with each key replaced by its value; every key must occur (a README that no longer
    names that URL or path must fail the test, not run something else)."""
    for old, new in replacements.items():
        if old not in command:
            raise AssertionError(f"{old!r} is not in the README's command {command!r}")
        command = command.replace(old, new)
    return command


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment as a new user's shell has it: without the virtualenv on PATH or
    activated, and without SPARK_HOME, PYSPARK_* or PYTHONPATH."""
    venv_bin = os.path.dirname(os.path.abspath(sys.executable))
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYSPARK_", "VIRTUAL_ENV")) and k not in ("SPARK_HOME", "PYTHONPATH", "SPARK_CONF_DIR")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p and os.path.abspath(p) != venv_bin)
    env.update(extra)
    return env


def run(command: str, cwd: str, timeout: float, **extra_env: str) -> subprocess.CompletedProcess:
    """``bash -c command`` in ``cwd`` with :func:`clean_env`; fails with the output's tail unless it exits 0."""
    proc = subprocess.run(["bash", "-c", command], cwd=cwd, env=clean_env(**extra_env), capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"{command}\nexit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return proc
