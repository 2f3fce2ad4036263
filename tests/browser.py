"""The real browser the viewer tests drive: Debian's Chromium through its chromedriver, with Selenium.

``make setup`` installs ``chromium`` and ``chromium-driver`` where it runs as root. Where they are missing the
browser tests skip with the install command, except in CI (``CI`` or ``MEMREADER_REQUIRE_BROWSER`` set; ``.ci/run``
sets the latter), where a missing browser fails them.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

INSTALL = "sudo apt-get install chromium chromium-driver (make setup does it where it runs as root)"


def chrome_paths() -> tuple[str | None, str | None]:
    """(browser, driver) executables found on this machine."""
    browser = next((p for p in (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")) if p), None)
    return browser, shutil.which("chromedriver")


def required() -> bool:
    """Whether a missing browser fails the tests (CI) instead of skipping them."""
    return bool(os.environ.get("MEMREADER_REQUIRE_BROWSER") or os.environ.get("CI"))


def start_browser() -> Iterator[Any]:
    """A headless Chromium session (logging the page's console), quit at the end."""
    browser, driver = chrome_paths()
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        browser = driver = None
    if not (browser and driver):
        message = f"no Chromium with chromedriver here (found browser={browser}, driver={driver}): {INSTALL}"
        if required():
            pytest.fail(message + " — CI needs the browser tests to run", pytrace=False)
        pytest.skip(message)
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,900"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    session = webdriver.Chrome(options=options, service=Service(driver))
    try:
        yield session
    finally:
        session.quit()


def open_page(session: Any, path: Path) -> float:
    """Open a local page and wait for its script to finish its first render; the seconds that took."""
    start = time.perf_counter()
    session.get(path.resolve().as_uri())
    return time.perf_counter() - start


def console_errors(session: Any) -> list[str]:
    """The console errors the page logged since the last call (a CSP violation is one)."""
    return [e["message"] for e in session.get_log("browser") if e.get("level") == "SEVERE"]
