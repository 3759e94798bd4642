"""The playground page is served without a key, with a Content-Security-Policy that allows
this origin's script only; its script puts server strings on the page as text; every data
call still needs the key."""

from __future__ import annotations

import httpx


def test_the_page_needs_no_key_but_every_data_call_does(api_server):
    page = httpx.get(f"{api_server}/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert httpx.get(f"{api_server}/playground").text == page.text
    script = httpx.get(f"{api_server}/playground/playground.js")
    assert script.status_code == 200 and script.headers["content-type"].startswith("text/javascript")
    assert httpx.get(f"{api_server}/playground/../app.py").status_code == 404
    assert httpx.get(f"{api_server}/playground/secrets.txt").status_code == 404
    for name in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
        assert name not in script.text, name  # strings from the server reach the page as text only
    assert httpx.get(f"{api_server}/v1/users").status_code == 401
