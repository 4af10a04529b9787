"""Opens a node's status page (/status) in real headless Chromium and checks
its charts: the adds per second, replication lag per peer and commit latency
charts are there, each has drawn points, and the adds chart has drawn a value
above zero (the caller made adds first). Optionally saves a screenshot.

Usage: status_page.py STATUS_URL [SCREENSHOT.png]
Exits 0 when every check passed; prints each check.
"""

import sys

from selenium.common.exceptions import WebDriverException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from browser import browser

WAIT_SECONDS = 30
CHARTS = ("chart-adds", "chart-lag", "chart-commit")


def drawn(page, chart):
    """The (x, y) points drawn in a chart's lines, and the chart's height."""
    svg = page.find_element(By.ID, chart)
    height = float(svg.get_attribute("height"))
    points = []
    for line in svg.find_elements(By.TAG_NAME, "polyline"):
        for pair in (line.get_attribute("points") or "").split():
            x, y = pair.split(",")
            points.append((float(x), float(y)))
    return points, height


def charts_drawn(page):
    """True once every chart has at least two points and adds rose above zero.
    The page reloads itself every 2 s, so an element may go stale: try again."""
    try:
        for chart in CHARTS:
            points, _ = drawn(page, chart)
            if len(points) < 2:
                return False
        adds, height = drawn(page, "chart-adds")
        return any(y < height for _, y in adds)
    except (WebDriverException, ValueError):
        return False


def check(page, url, screenshot=None):
    """Loads the status page in `page` and checks its charts."""
    page.get(url)
    try:
        WebDriverWait(page, WAIT_SECONDS, poll_frequency=0.2).until(charts_drawn)
    except Exception:
        found = {}
        for chart in CHARTS:
            try:
                found[chart] = len(drawn(page, chart)[0])
            except WebDriverException as error:
                found[chart] = f"missing ({error.msg})"
        raise SystemExit(f"FAIL the status page's charts were not drawn: points {found}")
    for chart in CHARTS:
        print(f"ok   {chart}: {len(drawn(page, chart)[0])} points drawn", flush=True)
    if screenshot:
        page.save_screenshot(screenshot)
        print(f"ok   screenshot {screenshot}", flush=True)


def main():
    url = sys.argv[1]
    screenshot = sys.argv[2] if len(sys.argv) > 2 else None
    page = browser(1100, 1000)
    try:
        check(page, url, screenshot)
    finally:
        page.quit()


if __name__ == "__main__":
    main()
