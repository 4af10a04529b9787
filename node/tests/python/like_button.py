"""Drives the node's like-button page (/demo/{key}) in real headless Chromium
(Debian's chromium and chromium-driver, through Selenium): it checks the
compact count, taps the heart and sees the count change, taps three times
and sees three likes, then sees an add made through another region's node
arrive on the page without a reload; it saves a screenshot.

Usage: like_button.py DEMO_URL OTHER_REGION_BASE KEY START SCREENSHOT.png
Exits 0 when every step passed; prints each step.
"""

import json
import shutil
import sys
import urllib.parse
import urllib.request

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

WAIT_SECONDS = 30


def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                     "--disable-gpu", "--window-size=480,360"):
        options.add_argument(argument)
    # The Debian driver, never a download (selenium-manager is not asked).
    driver = shutil.which("chromedriver") or "/usr/bin/chromedriver"
    return webdriver.Chrome(service=Service(executable_path=driver), options=options)


def shown(page):
    count = page.find_element(By.ID, "count")
    return count.get_attribute("data-value"), count.text


def wait_for(page, value, text, step):
    def arrived(_):
        return shown(page) == (str(value), text)
    try:
        WebDriverWait(page, WAIT_SECONDS, poll_frequency=0.05).until(arrived)
    except Exception:
        raise SystemExit(f"FAIL {step}: the page shows {shown(page)}, expected {(str(value), text)}")
    print(f"ok   {step}: {text} ({value})", flush=True)


def add_elsewhere(base, key, delta):
    request = urllib.request.Request(
        f"{base}/v1/counters/{urllib.parse.quote(key, safe='')}",
        data=json.dumps({"delta": delta}).encode(),
        headers={"Content-Type": "application/json", "Idempotency-Key": "other-region-1"},
        method="POST")
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)["value"]


def main():
    demo_url, other_base, key, start, screenshot = sys.argv[1:6]
    start = int(start)
    page = browser()
    try:
        page.get(demo_url)
        wait_for(page, start, "40.2K", "the current count, compact")
        heart = page.find_element(By.ID, "like")
        heart.click()
        wait_for(page, start + 1, "40.2K", "one tap is one like")
        for _ in range(3):
            heart.click()
        wait_for(page, start + 4, "40.2K", "three taps are three likes")
        add_elsewhere(other_base, key, 1000)
        wait_for(page, start + 1004, "41.2K", "another region's add arrives live")
        title = page.find_element(By.ID, "title").text
        if title != key:
            raise SystemExit(f"FAIL the page names the counter {title!r}, not {key!r}")
        page.save_screenshot(screenshot)
        print(f"ok   screenshot {screenshot}", flush=True)
    finally:
        page.quit()


if __name__ == "__main__":
    main()
