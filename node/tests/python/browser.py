"""Headless Chromium for the browser tests: Debian's chromium and
chromium-driver through Selenium, never a downloaded browser or driver."""

import shutil

from selenium import webdriver
from selenium.webdriver.chrome.service import Service


def browser(width=480, height=480):
    """A new headless Chromium window of width x height pixels."""
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                     "--disable-gpu", f"--window-size={width},{height}"):
        options.add_argument(argument)
    # The Debian driver: selenium-manager is never asked to download one.
    driver = shutil.which("chromedriver") or "/usr/bin/chromedriver"
    return webdriver.Chrome(service=Service(executable_path=driver), options=options)
