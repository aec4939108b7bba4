"""Helpers of the capture proxy's tests: the upstream key, proxies, harness clients, raw sockets, polling."""

from __future__ import annotations

import socket
import time

from harbor_gym.proxy import CaptureProxy, ModelUpstream, ProxyLimits

#: The upstream's key, as the host holds it: it must reach the upstream and nothing else.
UPSTREAM_KEY = "sk-upstream-Zq8x0secret-do-not-leak-4711"
KEY_ENV = "HG_TEST_PROXY_UPSTREAM_KEY"



def make_proxy(url: str, **limits) -> CaptureProxy:
    proxy = CaptureProxy(ModelUpstream(base_url=url, api_key_env=KEY_ENV), limits=ProxyLimits(**limits))
    proxy.start()
    return proxy


def address(proxy: CaptureProxy) -> str:
    return f"127.0.0.1:{proxy.port}"


def openai_client(proxy: CaptureProxy, token: str):
    import openai

    s_url = f"http://{address(proxy)}/v1"
    return openai.OpenAI(base_url=s_url, api_key=token, max_retries=0, timeout=60)


def anthropic_client(proxy: CaptureProxy, token: str):
    import anthropic

    return anthropic.Anthropic(base_url=f"http://{address(proxy)}", api_key=token, max_retries=0, timeout=60)


def wait_for(predicate, timeout: float = 30.0, what: str = "a condition") -> None:
    """Poll ``predicate`` until true (generous: the machine is shared)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def raw_request(proxy: CaptureProxy, data: bytes, *, timeout: float = 30.0) -> bytes:
    """Send ``data`` on a fresh connection and read until the proxy closes it."""
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=timeout) as sock:
        sock.sendall(data)
        return read_all(sock)


def read_all(sock: socket.socket) -> bytes:
    out = b""
    while True:
        try:
            piece = sock.recv(65536)
        except ConnectionResetError:
            break
        if not piece:
            break
        out += piece
    return out
