"""Debian's chromium driven by Selenium through Debian's chromedriver, headless, for the dashboard test.

Missing browser: the test is skipped locally and fails in CI (scripts/setup installs both with apt as root).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from needs import require

T = TypeVar("T")

HEADLESS_FLAGS = (
    "--headless=new",
    "--no-sandbox",  # root in a container: chromium's sandbox needs user namespaces it may not have
    "--disable-gpu",
    "--disable-dev-shm-usage",  # small /dev/shm in containers
    "--window-size=1400,1100",
)


@contextmanager
def chromium(profile_dir: Path) -> Iterator[Any]:
    """A headless chromium session; quits in any case."""
    browser, driver = shutil.which("chromium"), shutil.which("chromedriver")
    missing = "chromium or chromedriver is missing" if browser is None or driver is None else None
    require(missing, "scripts/setup installs Debian's chromium and chromium-driver with apt as root")
    assert browser is not None and driver is not None
    os.environ.setdefault("SE_OFFLINE", "true")  # Selenium Manager must not try to download anything
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for flag in (*HEADLESS_FLAGS, f"--user-data-dir={profile_dir}"):
        options.add_argument(flag)
    session = webdriver.Chrome(service=Service(driver), options=options)
    try:
        yield session
    finally:
        session.quit()


def unless_stale(read: Callable[[], T]) -> T | None:
    """`read()`, or None when the page re-rendered an element under it (the dashboard redraws its lists on
    every poll, so an element found a moment ago may be gone): a polling caller just tries again."""
    from selenium.common.exceptions import StaleElementReferenceException

    try:
        return read()
    except StaleElementReferenceException:
        return None


def save_artifact(source: Path) -> Path:
    """Print where a test artifact is; copy it to $VERITRAIN_ARTIFACTS when set (CI keeps that folder)."""
    print(f"artifact: {source}")
    target_dir = os.environ.get("VERITRAIN_ARTIFACTS")
    if not target_dir:
        return source
    Path(target_dir).mkdir(parents=True, exist_ok=True)
    target = Path(target_dir) / source.name
    shutil.copy2(source, target)
    print(f"artifact copied to {target}")
    return target
