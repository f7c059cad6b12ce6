"""What a web page or a rebound name cannot make the server do (rocmforge_serve/request_guard.py): bodies other
than JSON get 415, a Host that does not name the server and a foreign Origin get 403, and no redirect names a
host taken from the request; the rules themselves, then a live server on a real socket."""

from __future__ import annotations

import httpx
import pytest

from support.engine_testing import tiny_model
from support.serve_testing import live_server, metrics

from rocmforge_serve.request_guard import HostPolicy, split_host


def test_split_host_reads_names_ports_and_bracketed_ipv6():
    assert split_host("Example.COM:8080") == ("example.com", 8080)
    assert split_host("[::1]:80") == ("::1", 80) and split_host("[::1]") == ("::1", None)
    for bad in ("", ":80", "a:b", "::1", "[::1]x", "a:123456"):
        with pytest.raises(ValueError):
            split_host(bad)


def test_on_loopback_only_the_loopback_names_at_the_listening_port():
    policy = HostPolicy("127.0.0.1")
    for good in ("127.0.0.1:8080", "localhost:8080", "[::1]:8080", "LOCALHOST", "127.0.0.1"):
        assert policy.host_allowed(good, 8080), good
    for bad in ("evil.example", "evil.example:8080", "localhost:9090", "127.0.0.1.evil.example:8080", "10.0.0.1:8080"):
        assert not policy.host_allowed(bad, 8080), bad
    assert HostPolicy("127.0.0.1", allowed_hosts=("mybox.lan",)).host_allowed("mybox.lan:8080", 8080)
    assert policy.origin_allowed("http://localhost:8080", 8080) and policy.origin_allowed("http://127.0.0.1:8080/", 8080)
    for bad in ("http://evil.example", "http://localhost:3000", "null", "file://", "http://localhost:8080.evil.example"):
        assert not policy.origin_allowed(bad, 8080), bad
    assert HostPolicy("127.0.0.1", cors_origins=("http://localhost:3000",)).origin_allowed("http://localhost:3000", 8080)


def test_elsewhere_any_name_unless_allowed_hosts_are_given_and_origins_only_by_list():
    anywhere = HostPolicy("0.0.0.0")
    assert anywhere.host_allowed("server.lan:8080", 8080) and anywhere.host_allowed("evil.example", 8080)
    assert not anywhere.origin_allowed("http://server.lan:8080", 8080)  # no list: no web page drives it
    listed = HostPolicy("0.0.0.0", allowed_hosts=("server.lan", "*.corp.example"))
    assert listed.host_allowed("server.lan:8080", 8080) and listed.host_allowed("a.corp.example", 8080)
    assert not listed.host_allowed("evil.example:8080", 8080) and not listed.host_allowed("corp.example", 8080)
    assert listed.origin_allowed("http://server.lan:8080", 8080)  # its own pages at its own port
    assert HostPolicy("0.0.0.0", cors_origins=("*",)).origin_allowed("https://anything.example", 8080)


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    with live_server(tiny_model(tmp_path_factory), cors_origins=("http://localhost:3000",)) as server:
        yield server


def generate(live, **kwargs) -> httpx.Response:
    return httpx.post(live.url + "/v1/completions", timeout=30, **kwargs)


def test_bodies_that_are_not_json_get_415_and_run_nothing(live):
    before = metrics(live.url)["rocmforge_generated_tokens_total"]
    body = '{"prompt": "a", "max_tokens": 2}'
    for headers, payload in (({"Content-Type": "text/plain"}, {"content": body}), ({}, {"content": body}),
                             ({}, {"data": {"prompt": "a", "max_tokens": "2"}}),
                             ({}, {"files": {"prompt": ("p", b"a")}})):
        response = generate(live, headers=headers, **payload)
        assert response.status_code == 415 and response.json()["error"]["code"] == "unsupported_media_type"
    assert generate(live, content=body, headers={"Content-Type": "application/json; charset=utf-8"}).status_code == 200
    assert metrics(live.url)["rocmforge_generated_tokens_total"] == before + 2


def test_a_host_that_does_not_name_the_server_gets_403(live):
    port = live.port
    for host in ("evil.example", f"evil.example:{port}", f"localhost:{port + 1}"):
        response = httpx.get(live.url + "/v1/models", headers={"Host": host})
        assert response.status_code == 403 and response.json()["error"]["code"] == "host_not_allowed", host
    assert httpx.get(live.url + "/v1/models", headers={"Host": f"localhost:{port}"}).status_code == 200


def test_a_foreign_origin_gets_403_and_an_allowed_one_its_cors_headers(live):
    foreign = generate(live, json={"prompt": "a", "max_tokens": 1}, headers={"Origin": "http://evil.example"})
    assert foreign.status_code == 403 and foreign.json()["error"]["code"] == "origin_not_allowed"
    own = generate(live, json={"prompt": "a", "max_tokens": 1}, headers={"Origin": f"http://127.0.0.1:{live.port}"})
    assert own.status_code == 200
    listed = generate(live, json={"prompt": "a", "max_tokens": 1}, headers={"Origin": "http://localhost:3000"})
    assert listed.status_code == 200 and listed.headers["access-control-allow-origin"] == "http://localhost:3000"
    preflight = httpx.options(live.url + "/v1/completions", headers={
        "Origin": "http://localhost:3000", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type, authorization"})
    assert preflight.status_code == 200 and preflight.headers["access-control-allow-origin"] == "http://localhost:3000"
    refused = httpx.options(live.url + "/v1/completions", headers={
        "Origin": "http://evil.example", "Access-Control-Request-Method": "POST"})
    assert refused.status_code == 403 and "access-control-allow-origin" not in refused.headers


def test_no_redirect_names_a_host_from_the_request(live):
    response = httpx.get(live.url + "/v1/models/", headers={"Host": f"localhost:{live.port}"})
    assert response.status_code == 404 and "location" not in response.headers


def test_the_rules_reach_the_http_process(tmp_path_factory):
    with live_server(tiny_model(tmp_path_factory), http_process=True, allowed_hosts=("mybox.lan",)) as live:
        assert httpx.get(live.url + "/v1/models", headers={"Host": "evil.example"}).status_code == 403
        assert httpx.get(live.url + "/v1/models", headers={"Host": f"mybox.lan:{live.port}"}).status_code == 200
        assert generate(live, content=b"{}", headers={"Content-Type": "text/plain"}).status_code == 415
