"""A person's view of a notebook for the tests: a JupyterLab server (stopped by pid, with the kernels it started)
and Debian's headless Chromium driven by Selenium, which opens a notebook, runs its cells from the Run menu,
watches the outputs while they run and takes screenshots.

Chromium and its driver come from Debian's packages (`apt-get install chromium chromium-driver`, as .ci/run
does); Selenium talks to /usr/bin/chromedriver directly (its own driver download is not used)."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
# no background connections (this machine's network is closed: Chromium would retry them), no sandbox as root
CHROMIUM_FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--window-size=1400,1600")


def require_chromium() -> None:
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.path.exists(p)]
    assert not missing, (f"{', '.join(missing)} missing: the browser tests need Debian's Chromium "
                         "(apt-get install -y chromium chromium-driver; .ci/run installs them)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _processes_mentioning(text: str) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                if text.encode() in f.read():
                    found.append(int(name))
        except OSError:
            continue
    return found


class JupyterLab:
    """``python -m jupyterlab`` on loopback with a per-run token, serving ``root_dir``, its runtime files (kernel
    connection files) under ``work``; ``env`` is the whole environment its kernels get."""

    def __init__(self, root_dir: str, work: str, env: dict[str, str]):
        self.root_dir, self.work = root_dir, work
        self.port, self.token = _free_port(), secrets.token_hex(16)
        self.runtime = os.path.join(work, "runtime")
        self.log = os.path.join(work, "jupyterlab.log")
        self.env = dict(env, JUPYTER_RUNTIME_DIR=self.runtime, JUPYTER_CONFIG_DIR=os.path.join(work, "config"),
                        JUPYTERLAB_SETTINGS_DIR=os.path.join(work, "lab-settings"),
                        JUPYTERLAB_WORKSPACES_DIR=os.path.join(work, "lab-workspaces"))
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 120) -> "JupyterLab":
        os.makedirs(self.runtime, exist_ok=True)
        # every cell in the page (no windowing of cells out of view), as the tests read outputs from the page
        tracker = os.path.join(self.env["JUPYTERLAB_SETTINGS_DIR"], "@jupyterlab", "notebook-extension")
        os.makedirs(tracker, exist_ok=True)
        with open(os.path.join(tracker, "tracker.jupyterlab-settings"), "w") as f:
            json.dump({"windowingMode": "none"}, f)
        # no "get notified about Jupyter news?" toast over the page (and no fetch of the news: no network here)
        apputils = os.path.join(self.env["JUPYTERLAB_SETTINGS_DIR"], "@jupyterlab", "apputils-extension")
        os.makedirs(apputils, exist_ok=True)
        with open(os.path.join(apputils, "notification.jupyterlab-settings"), "w") as f:
            json.dump({"fetchNews": "false"}, f)
        cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={self.port}",
               f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={self.root_dir}",
               "--ServerApp.port_retries=0", "--ServerApp.terminals_enabled=False", "--LabApp.extension_manager=readonly",
               "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
        if os.geteuid() == 0:  # CI's machines run as root
            cmd.append("--allow-root")
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(cmd, cwd=self.root_dir, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"JupyterLab exited:\n{open(self.log).read()[-3000:]}"
            try:
                self.api("status")
                return self
            except OSError:
                time.sleep(0.5)
        raise AssertionError(f"JupyterLab did not answer within {timeout} s:\n{open(self.log).read()[-3000:]}")

    def api(self, path: str, method: str = "GET") -> object:
        req = urllib.request.Request(f"{self.url}/api/{path}", method=method, headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(req, timeout=10) as r:
            body = r.read()
        return json.loads(body) if body else None

    def stop(self) -> list[int]:
        """Shuts the kernels down through the API, then stops the server's process group by pid and any process
        left that names this server's runtime folder (a kernel); returns the pids that had to be killed."""
        killed = []
        if self.proc is None:
            return killed
        try:
            for kernel in self.api("kernels"):
                self.api(f"kernels/{kernel['id']}", method="DELETE")
        except OSError:
            pass
        for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 10)):
            if self.proc.poll() is None:
                try:
                    os.killpg(self.proc.pid, sig)
                except ProcessLookupError:
                    pass
                try:
                    self.proc.wait(timeout=wait)
                except subprocess.TimeoutExpired:
                    pass
        for pid in _processes_mentioning(self.runtime):
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except ProcessLookupError:
                pass
        return killed


class Browser:
    """Headless Chromium through Selenium, with a fresh profile under ``work``."""

    def __init__(self, work: str):
        require_chromium()
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        os.makedirs(work, exist_ok=True)
        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for flag in CHROMIUM_FLAGS + (f"--user-data-dir={os.path.join(work, 'chromium-profile')}",):
            options.add_argument(flag)
        self.driver = webdriver.Chrome(service=Service(CHROMEDRIVER, log_output=os.path.join(work, "chromedriver.log")),
                                       options=options)

    def js(self, script: str, *args):
        return self.driver.execute_script(script, *args)

    def wait_for(self, what, timeout: float, message: str, interval: float = 0.25):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = what()
            if value:
                return value
            time.sleep(interval)
        raise AssertionError(f"{message} (after {timeout:.0f} s)")

    def click_menu(self, menu: str, item: str, timeout: float = 30) -> None:
        """A person's click on JupyterLab's menu bar entry ``menu``, then on its item ``item``."""
        from selenium.webdriver.common.by import By

        def find(xpath):
            return self.driver.find_elements(By.XPATH, xpath)

        bar = self.wait_for(lambda: find(f"//li[contains(@class,'lm-MenuBar-item')][.//div[normalize-space()='{menu}']]"),
                            timeout, f"no {menu!r} in JupyterLab's menu bar")
        bar[0].click()
        entry = self.wait_for(lambda: find(f"//li[contains(@class,'lm-Menu-item')][.//div[contains(@class,'lm-Menu-itemLabel')"
                                           f" and normalize-space()='{item}']]"), timeout, f"no {item!r} in the {menu!r} menu")
        entry[0].click()

    def screenshot(self, path: str) -> str:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        assert self.driver.save_screenshot(path), path
        return path

    def quit(self) -> None:
        self.driver.quit()


def artifacts_dir(root: str) -> str:
    """Where tests keep what a person would look at (screenshots): $SDT_TEST_ARTIFACTS, else test-artifacts/ in the
    checkout (ignored by git)."""
    where = os.environ.get("SDT_TEST_ARTIFACTS") or os.path.join(root, "test-artifacts")
    os.makedirs(where, exist_ok=True)
    return where


def copy_notebook(src: str, dest_dir: str) -> str:
    """A copy to open (JupyterLab saves what it opens: never the checkout's file)."""
    os.makedirs(dest_dir, exist_ok=True)
    return shutil.copy(src, dest_dir)


# each cell of the open notebook: its prompt ("[*]:" queued or running, "[3]:" done), its outputs' text and its
# progress bars (ipywidgets' IntProgress in tqdm.auto's box: the box's text and the bar's width)
_CELLS_JS = """
return Array.from(document.querySelectorAll('.jp-NotebookPanel .jp-Notebook .jp-Cell')).map(c => {
  const prompt = c.querySelector('.jp-InputPrompt');
  const out = c.querySelector('.jp-OutputArea');
  return {code: c.classList.contains('jp-CodeCell'), prompt: prompt ? prompt.textContent.trim() : '',
          output: out ? out.textContent : '',
          bars: Array.from(c.querySelectorAll('.widget-hprogress')).map(p => {
            const box = p.closest('.widget-hbox') || p.parentElement;
            const bar = p.querySelector('.progress-bar');
            return {text: box.textContent.trim(), width: bar ? bar.style.width : ''};
          })};
});
"""


def run_all_cells(browser: Browser, lab: JupyterLab, notebook: str, timeout: float, on_snapshot=None,
                  interval: float = 0.3) -> tuple[list[dict], list[tuple[float, list[dict]]]]:
    """Opens ``notebook`` (a path under the server's root) in JupyterLab, waits for its kernel, runs every cell
    from the Run menu and watches the page until no cell is queued or running. ``on_snapshot(seconds, cells)``
    sees every look at the page. Returns the cells at the end and the snapshots ``(seconds, cells)`` taken while
    cells ran (outputs left out but for bars)."""
    browser.driver.get(f"{lab.url}/lab/tree/{notebook}?token={lab.token}")
    n_cells = browser.wait_for(lambda: len(browser.js(_CELLS_JS)), 120, f"JupyterLab showed no cell of {notebook}")

    def kernel_idle():
        sessions = [s for s in lab.api("sessions") if s.get("path", "").endswith(os.path.basename(notebook))]
        return sessions and sessions[0]["kernel"]["execution_state"] == "idle"

    browser.wait_for(kernel_idle, 120, f"the kernel of {notebook} never became idle")
    browser.click_menu("Run", "Run All Cells")
    start = time.monotonic()
    browser.wait_for(lambda: any(c["prompt"] == "[*]:" for c in browser.js(_CELLS_JS)), 30,
                     "Run All Cells queued no cell")
    snapshots = []
    while True:
        cells = browser.js(_CELLS_JS)
        seconds = time.monotonic() - start
        if on_snapshot is not None:
            on_snapshot(seconds, cells)
        if not any(c["prompt"] == "[*]:" for c in cells):
            return cells, snapshots
        snapshots.append((seconds, [{"prompt": c["prompt"], "bars": c["bars"]} for c in cells]))
        assert seconds < timeout, f"cells still running after {timeout} s: " + str([c["prompt"] for c in cells][:n_cells])
        time.sleep(interval)
