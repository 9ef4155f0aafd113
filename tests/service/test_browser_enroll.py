"""Enrollment in headless Chromium (Selenium) through `serve` and the simulator's consent page;
skipped where Chromium or its driver is not installed."""

from __future__ import annotations

import json
import shutil
import signal
from collections.abc import Iterator
from typing import Any

import pytest

from lta_worker.simulator import LATEST_CHANGE_SCOPE, STATS_SCOPE
from support.process import Workspace, stop

from .conftest import listen_for_enrollment

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        CHROMIUM is None or CHROMEDRIVER is None,
        reason="no Chromium/chromedriver installed (apt-get install chromium chromium-driver)",
    ),
]


@pytest.fixture
def driver() -> Iterator[Any]:
    """A headless Chromium through Debian's chromedriver (Selenium Manager never runs)."""
    webdriver = pytest.importorskip("selenium.webdriver")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(flag)
    service = webdriver.ChromeService(executable_path=str(CHROMEDRIVER))
    browser = webdriver.Chrome(options=options, service=service)
    browser.set_page_load_timeout(30)
    try:
        yield browser
    finally:
        browser.quit()


@pytest.fixture
def served(world: Workspace) -> Iterator[Workspace]:
    """`serve` with `[enroll] listen` on a free loopback port, the simulator showing its
    consent page."""
    world.sim.configure(consent_page=True)
    listen_for_enrollment(world)
    proc = world.start_serve()
    try:
        world.wait_for_event("enroll.listening", proc, timeout=60)
        yield world
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, world.log_lines()[-5:]
    finally:
        stop(proc)


def link_for(world: Workspace, user: str) -> str:
    done = world.cli("enroll", "link", "--user", user, "--valid", "10m")
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def outcome(driver: Any) -> str:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.wait import WebDriverWait

    heading = WebDriverWait(driver, 30).until(
        expected_conditions.presence_of_element_located((By.ID, "outcome"))
    )
    return str(heading.get_attribute("data-outcome"))


def users(world: Workspace) -> dict[str, dict[str, Any]]:
    done = world.cli("users", "list", "--format", "json")
    assert done.returncode == 0, done.stderr
    return {row["user"]: row for row in json.loads(done.stdout)}


def test_click_untick_allow_deny_and_replay_in_a_real_browser(
    served: Workspace, driver: Any
) -> None:
    """Allow with a scope unticked keeps the other; Deny stores nothing; a reused link says so."""
    from selenium.webdriver.common.by import By

    link = link_for(served, "ada")
    driver.get(link)
    stats = driver.find_element(By.CSS_SELECTOR, f'input[name="scope"][value="{STATS_SCOPE}"]')
    assert stats.is_selected()
    stats.click()
    assert not stats.is_selected()
    driver.find_element(By.ID, "allow").click()
    assert outcome(driver) == "enrolled"
    assert driver.find_element(By.TAG_NAME, "h1").text == "Access granted"
    assert "code=" in driver.current_url  # the service's redirect: single-use, now spent
    listed = users(served)
    assert listed["ada"]["state"] == "active"
    assert listed["ada"]["has_token"] is True
    assert listed["ada"]["scopes"] == [LATEST_CHANGE_SCOPE]
    assert driver.get_cookies() == [] or all(
        c["name"] != "lta-enroll" for c in driver.get_cookies()
    )

    driver.get(link_for(served, "bob"))
    driver.find_element(By.ID, "deny").click()
    assert outcome(driver) == "denied"
    assert "bob" not in users(served) or users(served)["bob"]["has_token"] is False

    driver.get(link)
    assert outcome(driver) == "link_used"
    assert "already used" in driver.find_element(By.TAG_NAME, "h1").text

    events = [e for e in served.log_events() if e["event"] == "enroll.page"]
    assert [e["outcome"] for e in events] == [
        "consent",
        "enrolled",
        "consent",
        "denied",
        "link_used",
    ]
    log_text = "\n".join(served.log_lines())
    assert "code=" not in log_text and "dspa_" not in log_text
