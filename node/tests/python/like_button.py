"""Two people on the node's like-button page (/demo/{key}) in real headless
Chromium (Debian's chromium and chromium-driver, through Selenium): person A
on region 1's page and person B on region 2's page. A likes, B likes, A
unlikes, A likes again; a double tap on the post and a double-clicked heart
change the count by at most one; a page whose person changes shows that
person's heart, and a tap the node refuses (a name too long) is undone. After each step both pages show the same exact count (in
compact form, "40.2K") and each heart shows its own person's state; "seen
by" counts both people on both pages. Saves a screenshot of A's page.

Usage: like_button.py URL_A URL_B START SCREENSHOT.png
  URL_A, URL_B: the demo pages of the two regions (the same key);
  START: the like set's count before A and B come.
Exits 0 when every step passed; prints each step.
"""

import sys

from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

from browser import browser

WAIT_SECONDS = 30


def compact(value):
    """The count as the seed shows it (and the page's Intl compact format)."""
    for size, suffix in ((10**9, "B"), (10**6, "M"), (10**3, "K")):
        if value >= size:
            text = f"{value / size:.1f}".rstrip("0").rstrip(".")
            return text + suffix
    return str(value)


def state(page):
    """What a page shows: (exact count, compact count, heart pressed, settled)."""
    count = page.find_element(By.ID, "count")
    heart = page.find_element(By.ID, "like")
    return (count.get_attribute("data-value"), count.text,
            heart.get_attribute("aria-pressed"), heart.get_attribute("data-settled"))


def wait_for(page, name, count, pressed, step):
    wanted = (str(count), compact(count), "true" if pressed else "false", "true")
    try:
        WebDriverWait(page, WAIT_SECONDS, poll_frequency=0.05).until(lambda _: state(page) == wanted)
    except Exception:
        raise SystemExit(f"FAIL {step}: {name}'s page shows {state(page)}, expected {wanted}")
    print(f"ok   {step}: {name} sees {compact(count)} ({count}), heart "
          f"{'filled' if pressed else 'empty'}", flush=True)


def both(pages, count, a_likes, b_likes, step):
    wait_for(pages[0], "A", count, a_likes, step)
    wait_for(pages[1], "B", count, b_likes, step)


def wait_seen(page, name, estimate, step):
    def arrived(_):
        return page.find_element(By.ID, "seen").get_attribute("data-value") == str(estimate)
    try:
        WebDriverWait(page, WAIT_SECONDS, poll_frequency=0.1).until(arrived)
    except Exception:
        seen = page.find_element(By.ID, "seen").text
        raise SystemExit(f"FAIL {step}: {name}'s page shows {seen!r}, expected seen by {estimate}")
    print(f"ok   {step}: {name} sees \"seen by {estimate}\"", flush=True)


def choose_person(page, person):
    field = page.find_element(By.ID, "person")
    field.clear()
    field.send_keys(person, Keys.ENTER)


def main():
    url_a, url_b, start, screenshot = sys.argv[1:5]
    start = int(start)
    pages = []
    try:
        pages = [browser(), browser()]
        pages[0].get(url_a)
        pages[1].get(url_b)
        a, b = pages
        both(pages, start, False, False, "both open the post")
        where = a.find_element(By.ID, "where").text
        if "committed in" not in where or "by replication" not in where:
            raise SystemExit(f"FAIL the page does not say where a like goes: {where!r}")
        print(f"ok   A's page says: {where}", flush=True)

        heart_a = a.find_element(By.ID, "like")
        heart_b = b.find_element(By.ID, "like")
        heart_a.click()
        both(pages, start + 1, True, False, "A likes")
        heart_b.click()
        both(pages, start + 2, True, True, "B likes")
        heart_a.click()
        both(pages, start + 1, False, True, "A unlikes")
        heart_a.click()
        both(pages, start + 2, True, True, "A likes again")

        # A double tap on the post only likes: A already does, so nothing changes.
        ActionChains(a).double_click(a.find_element(By.ID, "photo")).perform()
        WebDriverWait(a, WAIT_SECONDS).until(
            lambda _: "double tap" in a.find_element(By.ID, "note").text)
        both(pages, start + 2, True, True, "A double-taps the post")
        # A double-clicked heart is two taps: an unlike and a like, never two likes.
        ActionChains(b).double_click(heart_b).perform()
        both(pages, start + 2, True, True, "B double-clicks the heart")

        # B's page changes person: the heart is the new person's, then B's again.
        choose_person(b, "cy")
        wait_for(b, "B (as cy)", start + 2, False, "B's page as cy, who never liked it")
        # A name the node refuses (130 bytes; a member is at most 128): the
        # tap is refused, the page says why, and the heart and count go back.
        choose_person(b, "\u00e9" * 65)
        heart_b.click()
        wait_for(b, "B (as a refused name)", start + 2, False, "a refused tap is undone")
        refusal = b.find_element(By.ID, "status").text
        if "128" not in refusal:
            raise SystemExit(f"FAIL the refusal is not explained: {refusal!r}")
        print(f"ok   the page says: {refusal}", flush=True)
        choose_person(b, "bo")
        wait_for(b, "B (as bo again)", start + 2, True, "B's page as bo again")

        # Each page view observed its person: ana, bo and cy, on both pages.
        wait_seen(a, "A", 3, "seen by everyone who opened the post")
        wait_seen(b, "B", 3, "seen by everyone who opened the post")
        a.save_screenshot(screenshot)
        print(f"ok   screenshot {screenshot}", flush=True)
    finally:
        for page in pages:
            page.quit()


if __name__ == "__main__":
    main()
