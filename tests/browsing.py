"""Headless Chromium for the tests that open the published site: skips where Chromium is
absent and CI is not set; in CI (which installs chromium and chromium-driver) it always runs.
The tests live beside the fixtures that build what they open (test_nightly.py's world,
test_mainjob.py's project), so each is built once per pytest-xdist worker."""

from __future__ import annotations

import contextlib
import functools
import http.server
import os
import shutil
import threading

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run")


def _missing() -> str | None:
    if not CHROMIUM or not DRIVER:
        return "chromium and chromium-driver are not installed (apt-get install chromium chromium-driver)"
    import importlib.util

    if importlib.util.find_spec("selenium") is None:
        return "selenium is not installed (pip install selenium)"
    return None


def _chromium(profile, flags=FLAGS):
    """A headless Chromium driven by selenium; fails in CI, skips elsewhere, where it is absent."""
    why = _missing()
    if why:
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    opts = Options()
    opts.binary_location = CHROMIUM
    for flag in flags:
        opts.add_argument(flag)
    opts.add_argument(f"--user-data-dir={profile}")
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(DRIVER), options=opts)


@contextlib.contextmanager
def _serving(directory):
    """The base URL of ``directory`` served on 127.0.0.1 for the duration."""
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(directory)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def _wait(driver, script: str, timeout: float = 30):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.2).until(lambda d: d.execute_script(script))


def _errors(driver) -> list[dict]:
    return [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
