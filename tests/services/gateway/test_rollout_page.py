"""The rollout page in the real (headless) Chromium: it shows the running rollout, and a click on
Pause pauses it. `ORL_SCREENSHOTS=<folder>` also keeps the screenshot (docs/images has one)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.services.gateway.conftest import StackFactory, Users

pytestmark = [pytest.mark.kafka, pytest.mark.slow, pytest.mark.browser]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
          "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed (deploy/setup.sh "
                    "installs it when run as root)")
def test_the_page_shows_the_rollout_and_pause_pauses_it(make_stack: StackFactory, tmp_path: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    stack = make_stack(min_samples=10_000, steps=[0.3, 1.0])
    users = Users(stack, 30)
    try:
        users.round()
        stack.publish(" yes")
        stack.wait(lambda s: s["rollout"] is not None and s["rollout"]["status"] == "running")
        for _ in range(4):
            users.round()
        stack.wait(lambda s: s["arms"]["challenger"]["rewards"] > 0)
    finally:
        users.close()

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=_FLAGS)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(stack.url + "/rollout/ui")
        page.fill("#key", stack.admin_key)
        page.dispatch_event("#key", "change")
        expect(page.locator("#status")).to_have_text("running")
        expect(page.locator("#versions")).to_contain_text("policy-v1")
        expect(page.locator("#split")).to_contain_text("challenger 30%")
        expect(page.locator("#chart circle").first).to_be_visible()  # reward points per version
        shot = tmp_path / "rollout-page.png"
        page.screenshot(path=str(shot), full_page=True)
        page.click("#pause")
        expect(page.locator("#status")).to_have_text("paused")
        expect(page.locator("#history")).to_contain_text(f"key:{stack.admin_key_id}")
        browser.close()
    assert stack.status()["rollout"]["status"] == "paused"  # the click reached the controller
    keep = os.environ.get("ORL_SCREENSHOTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(keep) / shot.name)
