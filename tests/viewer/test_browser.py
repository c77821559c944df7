"""The served viewer in a real browser: Debian's chromium and chromium-driver, headless.

CI installs both (.ci/browser-setup.sh); without them these tests skip and say why.
Screenshots go to $BAT_GYM_VIEWER_SHOTS when it is set (for people to look at).
"""

import os
import shutil
import threading
from pathlib import Path

import pytest

from bat_gym.viewer import Site, make_server

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(
    not (CHROMIUM and DRIVER),
    reason="no chromium and chromedriver on PATH (apt-get install chromium chromium-driver)",
)


@pytest.fixture(scope="module")
def browser():
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    opts = Options()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,1000"):  # fmt: skip
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(DRIVER), options=opts)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def served(eval_images, eval_ok):
    site = Site([eval_images, eval_ok])
    server = make_server(site)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", site
    server.shutdown()
    server.server_close()


def shot(driver, name):
    folder = os.environ.get("BAT_GYM_VIEWER_SHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(Path(folder) / name))


def errors(driver):
    return [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def in_view(driver, element):
    return driver.execute_script(
        "const r = arguments[0].getBoundingClientRect();"
        "return r.top >= 0 && r.top < window.innerHeight;",
        element,
    )


def test_overview_lists_the_cells_and_filters_them(browser, served, eval_images):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    url, _ = served
    browser.get(f"{url}/r0.html")
    rows = browser.find_elements(By.CSS_SELECTOR, "#cells tbody tr")
    keys = sorted(p.stem for p in (eval_images / "cells").glob("*.json"))
    assert sorted(r.find_element(By.TAG_NAME, "a").text for r in rows) == keys
    shot(browser, "overview.png")
    track = keys[0].split("-")[0]
    Select(browser.find_element(By.CSS_SELECTOR, "[data-filter=track]")).select_by_value(track)
    visible = [r for r in rows if r.is_displayed()]
    assert len(visible) == 1 and visible[0].get_attribute("data-track") == track
    browser.find_element(By.XPATH, "//th[normalize-space()='reward']").click()
    assert errors(browser) == []


def test_clicking_an_episode_shows_its_turns(browser, served, eval_images):
    from selenium.webdriver.common.by import By

    url, _ = served
    browser.get(f"{url}/r0.html")
    browser.find_element(By.CSS_SELECTOR, "#cells tbody tr a").click()
    turns = browser.find_elements(By.CSS_SELECTOR, ".msg[id^=turn-]")
    assert len(turns) >= 5
    assert browser.find_elements(By.CSS_SELECTOR, ".timeline a")
    assert browser.find_element(By.ID, "call-0").is_displayed()
    assert errors(browser) == []


def test_a_failed_items_evidence_link_scrolls_to_its_call(browser, served, eval_images):
    from selenium.webdriver.common.by import By

    url, _ = served
    key = sorted(p.stem for p in (eval_images / "episodes").glob("*.json"))[0]
    browser.get(f"{url}/r0-ep-{key}.html")
    shot(browser, "episode.png")
    link = browser.find_element(By.CSS_SELECTOR, ".item[data-passed=False] a.evidence")
    target = browser.find_element(By.ID, link.get_attribute("href").split("#")[1])
    assert not in_view(browser, target)
    link.click()
    assert in_view(browser, target)
    call = (
        target
        if target.get_attribute("id").startswith("call-")
        else target.find_element(By.XPATH, "ancestor::div[contains(@class, 'call')]")
    )
    assert call.get_attribute("id").startswith("call-")  # the call that wrote the file
    assert browser.execute_script("return location.hash") == "#" + target.get_attribute("id")
    shot(browser, "evidence.png")
    assert errors(browser) == []


def test_image_artifacts_render(browser, served, eval_images):
    from selenium.webdriver.common.by import By

    url, _ = served
    key = sorted(p.stem for p in (eval_images / "episodes").glob("*.json"))[0]
    browser.get(f"{url}/r0-ep-{key}.html")
    images = browser.find_elements(By.CSS_SELECTOR, "img.artifact")
    assert len(images) == 2
    for img in images:
        browser.execute_script("arguments[0].scrollIntoView()", img)
        loaded = browser.execute_script(
            "return arguments[0].complete && arguments[0].naturalWidth", img
        )
        assert loaded > 0, img.get_attribute("src")
    assert errors(browser) == []


def test_compare_page_opens_without_errors(browser, served):
    from selenium.webdriver.common.by import By

    url, _ = served
    browser.get(f"{url}/r1.html")
    browser.find_element(By.PARTIAL_LINK_TEXT, "(r0)").click()
    assert "vs" in browser.title
    assert browser.find_elements(By.CSS_SELECTOR, ".flip-down")
    assert errors(browser) == []
