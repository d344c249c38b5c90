"""The audit page in a real browser: Debian's headless Chromium, driven over WebDriver, against
`ragent-memory ui` started as a subprocess over a store the demo wrote. A screenshot of each
page is kept under tests/artifacts/ui/ (git ignores it); the path is printed."""

from __future__ import annotations

import shutil
import sqlite3
import tempfile
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait
from ui_process import SCOPE_A, SCOPE_B, UiProcess, copy_store, demo_store

ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts" / "ui"
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--window-size=1280,1000",
)


@pytest.fixture(scope="module")
def demo_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return demo_store(tmp_path_factory.mktemp("ui-browser"))


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    """Headless Chromium with a fresh profile (the machine has no network: nothing to fetch)."""
    profile = tempfile.mkdtemp(prefix="ragent-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    driver.set_page_load_timeout(60)
    driver.implicitly_wait(30)  # an element of a page still loading is waited for
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def _shot(driver: webdriver.Chrome, name: str, capsys: pytest.CaptureFixture[str]) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    assert driver.save_screenshot(str(path))
    with capsys.disabled():
        print(f"\n  screenshot: {path}")
    return path


def _open(driver: webdriver.Chrome, ui: UiProcess, path: str) -> None:
    driver.get(ui.url + path)


def _shows(driver: webdriver.Chrome, element_id: str, needle: str) -> str:
    """The text of ``element_id`` once it holds ``needle`` (a page a click opened may still
    be loading); fails after 30 s."""
    WebDriverWait(driver, 30).until(lambda d: needle in d.find_element(By.ID, element_id).text)
    return str(driver.find_element(By.ID, element_id).text)


def _active_facts(db: Path) -> list[tuple[int, str]]:
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT id, content FROM memories WHERE kind = 'fact' AND status = 'active' ORDER BY id"
        ).fetchall()
    conn.close()
    return rows


def test_each_page_loads_and_shows_generations_and_probes(
    browser: webdriver.Chrome, demo_db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Sessions list the demo; its page draws the chart and each generation with its probe
    counts; what survived lists probes linking to their raw message, which opens."""
    with UiProcess("--db", str(demo_db), "--session", "demo") as ui:
        _open(browser, ui, "/")
        names = [a.text for a in browser.find_elements(By.CSS_SELECTOR, "#sessions a")]
        assert "demo" in names
        _shot(browser, "sessions", capsys)

        browser.get(ui.shown)  # the address the ready line printed
        assert "Session demo" in browser.find_element(By.TAG_NAME, "h1").text
        assert browser.find_elements(By.CSS_SELECTOR, "svg.chart polyline")
        generations = browser.find_elements(By.CSS_SELECTOR, ".generation")
        assert len(generations) >= 1
        assert browser.find_elements(By.CSS_SELECTOR, ".generation .probes")
        _shot(browser, "session", capsys)

        browser.find_element(By.LINK_TEXT, "what survived").click()
        totals = _shows(browser, "totals", "kept")
        assert "recallable" in totals and "lost" in totals
        probes = browser.find_elements(By.CSS_SELECTOR, "tr.probe")
        assert probes
        _shot(browser, "probes", capsys)

        probes[0].find_element(By.CSS_SELECTOR, "a").click()
        assert _shows(browser, "content", "")
        assert "Message #" in browser.find_element(By.TAG_NAME, "h1").text
        _shot(browser, "message", capsys)


def test_forget_button_removes_that_fact_only(
    browser: webdriver.Chrome, demo_db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The forget link asks first; confirming deletes that fact and leaves the others."""
    db = copy_store(demo_db, tmp_path / "forget.db")
    before = _active_facts(db)
    assert len(before) >= 2
    target_id, target_text = before[0]
    with UiProcess("--db", str(db)) as ui:
        _open(browser, ui, "/user?id=demo-user")
        shown = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "tr.fact.active .content")]
        assert sorted(text for _, text in before) == sorted(shown)
        _shot(browser, "user", capsys)
        row = browser.find_element(By.ID, f"fact-{target_id}")
        row.find_element(By.CSS_SELECTOR, "a.forget").click()
        assert target_text == _shows(browser, "fact", target_text)
        assert before == _active_facts(db)  # asking is not forgetting
        _shot(browser, "forget-confirm", capsys)
        browser.find_element(By.ID, "confirm").click()
        _shows(browser, "forgot", f"#{target_id} was forgotten")
        browser.implicitly_wait(0)  # absent on purpose: no wait
        assert not browser.find_elements(By.ID, f"fact-{target_id}")
        browser.implicitly_wait(30)
        left = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "tr.fact.active .content")]
    assert before[1:] == _active_facts(db)
    assert sorted(text for _, text in before[1:]) == sorted(left)


def test_a_page_for_one_scope_lists_no_other_scope(
    browser: webdriver.Chrome, demo_db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Started with --scope, the list holds that scope's session only, and another scope's
    session page is not shown."""
    with UiProcess("--db", str(demo_db), "--scope", SCOPE_A) as ui:
        _open(browser, ui, "/")
        listed = [a.text for a in browser.find_elements(By.CSS_SELECTOR, "#sessions tr.session a")]
        assert f"{SCOPE_A}:alpha" in listed
        assert not [name for name in listed if name.startswith(SCOPE_B) or name == "demo"]
        _shot(browser, "scoped-sessions", capsys)
        _open(browser, ui, "/session?" + urllib.parse.urlencode({"id": f"{SCOPE_B}:beta"}))
        assert "not found" in _shows(browser, "error", "not found")
