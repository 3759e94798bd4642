"""The playground page in a real browser: Debian's Chromium, headless, driven by Selenium
through chromedriver, against a real uvicorn server on loopback and the loopback fake model.

It types an app key, adds a user, starts a session, watches a reply stream in, sees the
context view follow, uploads a file and sees it sent and then folded, edits and resends a
message, checks that markup in messages and replies stays text, resets the breaker and
closes the session. Screenshots go to the test's temporary directory and, when
``COMPANION_SCREENSHOT_DIR`` is set, are copied there too.

Skips (with the reason) when Chromium, chromedriver or the selenium package is missing;
``.ci/run`` installs Debian's ``chromium`` and ``chromium-driver`` so that CI runs it.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from pathlib import Path

import httpx
import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")

pytestmark = [
    pytest.mark.usefixtures("steady_fake_llm"),
    pytest.mark.skipif(
        CHROMIUM is None, reason="Chromium is not installed (Debian: apt-get install chromium chromium-driver)"
    ),
    pytest.mark.skipif(
        CHROMEDRIVER is None, reason="chromedriver is not installed (Debian: apt-get install chromium-driver)"
    ),
]

webdriver = pytest.importorskip(
    "selenium.webdriver", reason="the selenium package is not installed (pip install -e '.[test]')"
)
# after the skip above, so that a missing selenium skips instead of failing collection
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402

from tests.playground_env import fill_archive, lore_server  # noqa: E402,F401  (a fixture)

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1440,1000",
)

REPLY = "The tide turns twice a day, and the old pier creaks a little louder every single evening."
MARKUP = '<script>window.__pwned = 1</script><b>bold</b> <img src=x onerror="window.__pwned = 2">'


@pytest.fixture
def browser(tmp_path):
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path / 'chromium-profile'}")
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


@pytest.fixture
def shots(tmp_path):
    """``shot(driver, name)`` saves a PNG screenshot under the test's temporary directory
    (and in ``COMPANION_SCREENSHOT_DIR`` when set); returns its path."""
    folder = tmp_path / "screenshots"
    folder.mkdir()
    keep = os.environ.get("COMPANION_SCREENSHOT_DIR")

    def shot(driver, name: str) -> Path:
        path = folder / f"{name}.png"
        assert driver.save_screenshot(str(path)), name
        if keep:
            Path(keep).mkdir(parents=True, exist_ok=True)
            shutil.copy(path, Path(keep) / path.name)
        return path

    return shot


def wait(driver, condition, timeout: float = 30, message: str = ""):
    """Poll ``condition(driver)`` until it is true; elements the page re-renders meanwhile are retried."""
    ignored = (StaleElementReferenceException, NoSuchElementException)
    return WebDriverWait(driver, timeout, poll_frequency=0.05, ignored_exceptions=ignored).until(condition, message)


def text_of(driver, css: str) -> str:
    return driver.find_element(By.CSS_SELECTOR, css).text


def source_tokens(driver, source: str) -> int:
    cell = driver.find_element(By.CSS_SELECTOR, f'#sources tr[data-source="{source}"] td.num')
    return int(cell.text.split("/")[0])


def send(driver, text: str) -> None:
    box = driver.find_element(By.ID, "message")
    box.clear()
    box.send_keys(text)
    driver.find_element(By.ID, "send").click()


def wait_reply_done(driver) -> None:
    wait(
        driver,
        lambda d: (
            not d.find_elements(By.CSS_SELECTOR, "#messages .streaming")
            and not d.find_element(By.ID, "send").get_attribute("disabled")
        ),
        message="the reply never finished",
    )


def assistant_texts(driver) -> list[str]:
    return [e.text for e in driver.find_elements(By.CSS_SELECTOR, "#messages .turn.assistant .content")]


def test_the_playground_chats_streams_shows_the_context_and_keeps_markup_as_text(
    browser, shots, api_server, new_app, fake_llm, tmp_path
):
    _, key = new_app()
    _, other_key = new_app()
    httpx.post(f"{api_server}/v1/users", json={"id": "someone-elses"}, headers={"Authorization": f"Bearer {other_key}"})
    user = "ana-" + uuid.uuid4().hex[:6]

    browser.get(f"{api_server}/playground")
    assert "companion playground" in browser.title
    browser.find_element(By.ID, "key").send_keys("ck_not-a-key")
    browser.find_element(By.ID, "save-key").click()
    wait(browser, lambda d: "Key refused" in text_of(d, "#status"), message="a wrong key was not refused")
    assert browser.execute_script("return localStorage.getItem('companion.playground.key')") is None
    browser.find_element(By.ID, "key").clear()
    browser.find_element(By.ID, "key").send_keys(key)
    browser.find_element(By.ID, "save-key").click()
    wait(browser, lambda d: "connected" in text_of(d, "#status"), message="the key was not taken")
    assert browser.execute_script("return localStorage.getItem('companion.playground.key')") == key
    browser.find_element(By.ID, "new-user").send_keys(user)
    browser.find_element(By.ID, "create-user").click()
    wait(browser, lambda d: Select(d.find_element(By.ID, "user-select")).first_selected_option.text == user)
    users = [o.text for o in Select(browser.find_element(By.ID, "user-select")).options]
    assert "someone-elses" not in users  # another app's user is never listed
    browser.find_element(By.ID, "new-session").click()
    wait(browser, lambda d: text_of(d, "#session-info").startswith("s_"), message="no session started")
    assert text_of(browser, "#persona") == "Mira"
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, '#sources tr[data-source="persona"]'))
    before = int(browser.find_element(By.ID, "context-pane").get_attribute("data-total"))

    # 1. a reply streams in, word by word
    fake_llm.stream_delay = 0.12
    fake_llm.script.append(REPLY)
    send(browser, "Tell me about the sea <script>alert('user text')</script>")
    partial = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        text = browser.execute_script(
            "const e = document.querySelector('#messages .streaming .content'); return e ? e.textContent : null"
        )
        if text is None:
            break
        if text and text != REPLY:
            partial.append(text)
            if len(set(partial)) == 3:
                shots(browser, "0-streaming")
        time.sleep(0.03)
    assert len(set(partial)) >= 3, partial  # several growing prefixes were on screen before the end
    assert all(REPLY.startswith(p.rstrip()) for p in partial)
    wait_reply_done(browser)
    fake_llm.stream_delay = 0.0
    assert assistant_texts(browser)[-1] == REPLY
    users_said = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#messages .turn.user .content")]
    assert users_said == ["Tell me about the sea <script>alert('user text')</script>"]

    # 2. the context view follows: recent grew by the new turns
    wait(
        browser,
        lambda d: int(d.find_element(By.ID, "context-pane").get_attribute("data-total")) > before,
        message="the context view did not update",
    )
    assert source_tokens(browser, "recent") > 0
    assert "tokens +" in text_of(browser, "#context-total")
    assert browser.find_elements(By.CSS_SELECTOR, "#bar .seg.s-recent") and browser.find_elements(
        By.CSS_SELECTOR, "#bar .seg.s-reserve"
    )
    shots(browser, "1-after-first-reply")

    # 3. upload a file; it goes with the next message, then folds into retrieval for later turns
    notes = tmp_path / "tide-notes.txt"
    notes.write_text("High tide at 06:12 and 18:40. The pier is closed on Mondays.\n", encoding="utf-8")
    browser.find_element(By.ID, "file").send_keys(str(notes))
    wait(browser, lambda d: "tide-notes.txt" in text_of(d, "#attachments"), message="the upload chip never appeared")
    fake_llm.script.append("Got your tide notes.")
    send(browser, "Here are my tide notes.")
    wait_reply_done(browser)
    wait(
        browser,
        lambda d: "tide-notes.txt" in d.find_elements(By.CSS_SELECTOR, "#messages .turn.user")[-1].text,
        message="the sent message does not show its file",
    )
    assert text_of(browser, "#attachments") == ""  # sent: nothing is left waiting
    # the reply was made with the file inline; the next reply's context holds it folded
    wait(browser, lambda d: "folded (retrieval)" in text_of(d, "#context-files"), message="the file was not folded")
    wait(browser, lambda d: source_tokens(d, "retrieval") > 0)
    prompt_text = browser.execute_script("return document.getElementById('source-text-list').textContent")
    assert "Referenced files (attached earlier, shown folded" in prompt_text and "tide-notes.txt" in prompt_text
    shots(browser, "2-file-folded")

    # 4. a reply with markup is shown as text, and nothing in it runs
    fake_llm.script.append(MARKUP)
    send(browser, "Say something in HTML.")
    wait_reply_done(browser)
    assert assistant_texts(browser)[-1] == MARKUP
    assert browser.execute_script("return window.__pwned === undefined")
    assert not browser.find_elements(By.CSS_SELECTOR, "#messages b, #messages img, #messages script")
    shots(browser, "3-markup-as-text")

    # 5. edit and resend the second message: it and everything after it are replaced
    second = browser.find_elements(By.CSS_SELECTOR, "#messages .turn.user")[1]
    second.find_element(By.CSS_SELECTOR, "button.edit").click()
    wait(browser, lambda d: d.find_element(By.ID, "editing").is_displayed())
    fake_llm.script.append("Edited and answered.")
    send(browser, "Here are my tide notes, edited.")
    wait_reply_done(browser)
    wait(
        browser,
        lambda d: (
            [e.text for e in d.find_elements(By.CSS_SELECTOR, "#messages .turn.user .content")]
            == ["Tell me about the sea <script>alert('user text')</script>", "Here are my tide notes, edited."]
        ),
        message="the edit did not replace the later turns",
    )
    assert assistant_texts(browser) == [REPLY, "Edited and answered."]

    # 6. reset the breaker, close the session
    browser.find_element(By.ID, "reset-breaker").click()
    wait(browser, lambda d: "breaker closed" in text_of(d, "#status"))
    browser.find_element(By.ID, "close-session").click()
    wait(browser, lambda d: "closed by api" in text_of(d, "#session-info"), message="the session did not close")
    assert browser.find_element(By.ID, "send").get_attribute("disabled")
    shots(browser, "4-closed")


def test_the_context_view_shows_recall_reasons_lore_keys_notices_and_the_summary(browser, shots, lore_server):
    base, key, engine = lore_server
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=60) as http:
        session = http.post("/v1/sessions", json={"user_id": "ana"}).json()
        fill_archive(engine, key, session["id"])
        expected = http.get(f"/v1/sessions/{session['id']}/context").json()

    browser.set_window_size(1440, 1500)
    browser.get(base)
    browser.find_element(By.ID, "key").send_keys(key)
    browser.find_element(By.ID, "save-key").click()
    wait(browser, lambda d: "connected" in text_of(d, "#status"))
    Select(browser.find_element(By.ID, "user-select")).select_by_visible_text("ana")
    wait(browser, lambda d: text_of(d, "#session-info") == session["id"], message="the session was not picked")
    wait(
        browser,
        lambda d: d.find_element(By.ID, "context-pane").get_attribute("data-total") == str(expected["total_tokens"]),
    )

    cards = browser.find_elements(By.CSS_SELECTOR, "#recalled li.card")
    assert len(cards) == len(expected["recalled"]) > 0
    for card, seg in zip(cards, expected["recalled"], strict=True):
        head = card.find_element(By.CSS_SELECTOR, ".card-head").text
        assert head.startswith("2024-05-01") and f"score {seg['score']:.3f}" in head
        badges = [b.text for b in card.find_elements(By.CSS_SELECTOR, ".badge")]
        assert badges == [r.replace("_", " ") for r in seg["reasons"]]
        assert card.find_element(By.CSS_SELECTOR, ".content").text == seg["content"].strip()
    # what recall selected that the prompt does not show (the kept block stayed), under the shown ones
    withheld = browser.find_elements(By.CSS_SELECTOR, "#withheld li.card.withheld")
    assert [c.find_element(By.CSS_SELECTOR, ".content").text for c in withheld] == [
        seg["content"].strip() for seg in expected["withheld"]
    ]
    assert withheld, "the session's kept recall block left nothing out: the fixture no longer tests this"
    assert "fired by key lighthouse" in text_of(browser, "#lore") and "The old lighthouse" in text_of(browser, "#lore")
    notices = text_of(browser, "#notices")
    assert all(n["text"] in notices for n in expected["notices"]) and expected["notices"]
    assert "older lines are archived and may be recalled" in text_of(browser, "#summary")
    assert [r.get_attribute("data-source") for r in browser.find_elements(By.CSS_SELECTOR, "#sources tbody tr")] == [
        "persona",
        "summary",
        "memory",
        "retrieval",
        "recent",
    ]
    shots(browser, "5-recall-lore-summary")


def test_the_playground_uploads_a_card_shows_its_avatar_and_talks_as_the_chosen_character(
    browser, shots, api_server, new_app, fake_llm, tmp_path
):
    from PIL import Image

    from tests.cards import encode, v2_card

    _, key = new_app()
    user = "cleo-" + uuid.uuid4().hex[:6]
    card = v2_card(name="Harbour Pilot", system_prompt="You are {{char}}. PILOT-PROMPT.")
    path = tmp_path / "pilot.png"
    from PIL.PngImagePlugin import PngInfo

    info = PngInfo()
    info.add_text("chara", encode(card))
    Image.new("RGB", (64, 64), (20, 90, 160)).save(path, pnginfo=info)

    browser.get(f"{api_server}/playground")
    browser.find_element(By.ID, "key").send_keys(key)
    browser.find_element(By.ID, "save-key").click()
    wait(browser, lambda d: "connected" in text_of(d, "#status"), message="the key was not taken")
    browser.find_element(By.ID, "new-user").send_keys(user)
    browser.find_element(By.ID, "create-user").click()
    wait(browser, lambda d: Select(d.find_element(By.ID, "user-select")).first_selected_option.text == user)
    wait(
        browser,
        lambda d: [o.text for o in Select(d.find_element(By.ID, "character-select")).options] == ["Mira (deployment)"],
        message="the deployment's character is not offered",
    )  # this app has no character of its own yet

    browser.find_element(By.ID, "character-file").send_keys(str(path))
    wait(
        browser,
        lambda d: Select(d.find_element(By.ID, "character-select")).first_selected_option.text == "Harbour Pilot (app)",
        message="the uploaded card was not picked",
    )
    wait(
        browser,
        lambda d: d.execute_script(
            "const i = document.getElementById('avatar'); return !i.hidden && i.naturalWidth === 64"
        ),
        message="no avatar",
    )
    browser.find_element(By.ID, "new-session").click()
    wait(browser, lambda d: text_of(d, "#persona") == "Harbour Pilot", message="the session is not the pilot's")
    wait(  # the card's greeting opened the session
        browser, lambda d: assistant_texts(d) and "Welcome" in assistant_texts(d)[0], message="no greeting"
    )
    shots(browser, "character-picked")
    send(browser, "Where are we?")
    wait_reply_done(browser)
    system = [m["content"] for m in fake_llm.requests[-1]["messages"] if m["role"] == "system"]
    assert any("PILOT-PROMPT" in s for s in system)

    # back to the deployment's character: a new session talks as it, the pilot's session stays the pilot's
    Select(browser.find_element(By.ID, "character-select")).select_by_visible_text("Mira (deployment)")
    wait(browser, lambda d: d.find_element(By.ID, "avatar").get_attribute("hidden") is not None)
    browser.find_element(By.ID, "new-session").click()
    wait(browser, lambda d: text_of(d, "#persona") == "Mira", message="the new session is not Mira's")
    labels = [o.text for o in Select(browser.find_element(By.ID, "session-select")).options]
    assert any("Harbour Pilot" in label for label in labels) and any("· Mira ·" in label for label in labels)


def test_the_playground_shows_what_the_character_remembers_and_forgets_one(browser, shots, lore_server):
    base, key, engine = lore_server
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=60) as http:
        session = http.post("/v1/sessions", json={"user_id": "bo"}).json()
        fill_archive(engine, key, session["id"])
        memories = http.get("/v1/users/bo/memories").json()["data"]
    assert memories

    browser.set_window_size(1440, 1800)
    browser.get(base)
    browser.find_element(By.ID, "key").send_keys(key)
    browser.find_element(By.ID, "save-key").click()
    wait(browser, lambda d: "connected" in text_of(d, "#status"))
    Select(browser.find_element(By.ID, "user-select")).select_by_visible_text("bo")
    wait(
        browser,
        lambda d: len(d.find_elements(By.CSS_SELECTOR, "#memories li.memory")) == len(memories),
        message="the memories were not listed",
    )
    first = browser.find_element(By.CSS_SELECTOR, "#memories li.memory")
    gone, text = first.get_attribute("data-id"), first.find_element(By.CSS_SELECTOR, ".content").text
    assert text == memories[0]["content"].strip()
    shots(browser, "6-memories")
    first.find_element(By.CSS_SELECTOR, "button.forget").click()
    wait(browser, lambda d: "forgot" in text_of(d, "#status"), message="the memory was not forgotten")
    wait(
        browser,
        lambda d: gone not in [e.get_attribute("data-id") for e in d.find_elements(By.CSS_SELECTOR, "#memories li")],
    )
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=60) as http:
        left = [m["id"] for m in http.get("/v1/users/bo/memories").json()["data"]]
    assert gone not in left and len(left) == len(memories) - 1
