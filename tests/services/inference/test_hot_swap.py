"""Hot swaps under concurrent load: no request fails, each names (and ran on) its version."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx

from tests.services.inference.conftest import ServerFactory

PROMPT = [{"role": "user", "content": "Tell me a story"}]


def ask(url: str, key: str, model: str, stream: bool) -> tuple[str, str, str]:
    """(request_id, version, text) of one greedy answer."""
    body = {"model": model, "messages": PROMPT, "max_tokens": 10, "temperature": 0, "stream": stream}
    headers = {"Authorization": f"Bearer {key}"}
    if not stream:
        response = httpx.post(url + "/v1/chat/completions", json=body, headers=headers, timeout=60)
        response.raise_for_status()
        data = response.json()
        return data["request_id"], data["model"], data["choices"][0]["message"]["content"]
    text, version, request_id = "", "", ""
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, headers=headers,
                      timeout=60) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            assert "error" not in chunk, chunk
            request_id, version = chunk["request_id"], chunk["model"]
            text += chunk["choices"][0]["delta"].get("content", "")
    return request_id, version, text


def test_swapping_under_load_fails_nothing_and_names_the_version(
    make_server: ServerFactory, tiny_model: Path, adapters: list[Path]
) -> None:
    server = make_server(tiny_model, "tiny-llama", max_batch=8, max_loras=3)
    for name, folder in (("p-v1", adapters[0]), ("p-v2", adapters[1])):
        loaded = server.admin("POST", "/admin/adapters", json={"source": str(folder), "name": name})
        assert loaded.status_code == 201
    expected = {name: ask(server.url, server.key, name, False)[2] for name in ("p-v1", "p-v2")}
    assert expected["p-v1"] != expected["p-v2"]
    assert server.admin("PUT", "/admin/aliases/p", json={"version": "p-v1"}).status_code == 200

    results: list[tuple[str, str, str]] = []
    failures: list[BaseException] = []
    stop = threading.Event()

    def client(stream: bool) -> None:
        while not stop.is_set():
            try:
                results.append(ask(server.url, server.key, "p", stream))
            except BaseException as exc:  # every failure is a finding
                failures.append(exc)

    threads = [threading.Thread(target=client, args=(i % 2 == 0,)) for i in range(6)]
    for thread in threads:
        thread.start()
    sources = {"p-v1": adapters[0], "p-v2": adapters[1]}
    current = "p-v1"
    for _ in range(4):  # swap, drain and unload the old version, load it back: repeatedly
        time.sleep(0.5)
        other = "p-v2" if current == "p-v1" else "p-v1"
        if other not in {a["name"] for a in server.admin("GET", "/admin/adapters").json()["adapters"]}:
            loaded = server.admin("POST", "/admin/adapters",
                                  json={"source": str(sources[other]), "name": other})
            assert loaded.status_code == 201, loaded.text
        assert server.admin("PUT", "/admin/aliases/p", json={"version": other}).status_code == 200
        unloaded = server.admin("DELETE", f"/admin/adapters/{current}")
        assert unloaded.status_code == 204, unloaded.text
        current = other
    time.sleep(0.5)
    stop.set()
    for thread in threads:
        thread.join(timeout=120)

    assert not failures, failures[:3]
    assert len(results) >= 12
    seen = {version for _, version, _ in results}
    assert seen == {"p-v1", "p-v2"}
    for _, version, text in results:
        assert text == expected[version], version  # the named version is the one that answered
    deadline = time.monotonic() + 30
    while len(server.interactions()) < len(results) + 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    logged = {i.request_id: i.adapter_version for i in server.interactions()}
    assert all(logged[request_id] == version for request_id, version, _ in results)
