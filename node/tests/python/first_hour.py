"""The browser half of the README's first hour (node/tests/first_hour.rs):
on the dev cluster's demo page (the URL its banner prints), the person who
liked the post from the command line (`tally like post:1 sam`) sees the
heart filled and the count at 1; a tap unlikes (0), another likes again (1).
Then the status page's charts are drawn. Saves demo.png and status.png into
ARTIFACT_DIR.

Usage: first_hour.py DEMO_URL STATUS_URL ARTIFACT_DIR
Exits 0 when every step passed; prints each step.
"""

import os
import sys

from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

import status_page
from browser import browser

WAIT_SECONDS = 30


def main():
    demo_url, status_url, artifacts = sys.argv[1:4]
    page = browser(480, 480)
    try:
        page.get(demo_url)
        count = page.find_element(By.ID, "count")
        heart = page.find_element(By.ID, "like")

        def showing(value, pressed):
            return lambda _: (count.get_attribute("data-value") == value
                              and heart.get_attribute("aria-pressed") == pressed
                              and heart.get_attribute("data-settled") == "true")
        steps = (("the like from the command line: the heart is filled, the count is 1", "1", "true"),
                 ("a tap unlikes: the heart is empty, the count is 0", "0", "false"),
                 ("a tap likes again: the heart is filled, the count is 1", "1", "true"))
        for number, (step, value, pressed) in enumerate(steps):
            if number:
                heart.click()
            try:
                WebDriverWait(page, WAIT_SECONDS).until(showing(value, pressed))
            except Exception:
                raise SystemExit(f"FAIL {step}: the page shows {count.text!r}, "
                                 f"heart pressed {heart.get_attribute('aria-pressed')}")
            print(f"ok   {step}", flush=True)
        demo = os.path.join(artifacts, "demo.png")
        page.save_screenshot(demo)
        print(f"ok   screenshot {demo}", flush=True)
    finally:
        page.quit()
    page = browser(1100, 1000)
    try:
        status_page.check(page, status_url, os.path.join(artifacts, "status.png"))
    finally:
        page.quit()


if __name__ == "__main__":
    main()
