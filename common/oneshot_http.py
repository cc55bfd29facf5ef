"""httpx's one-shot calls (`get`, `post`, `put`, `delete`, `request`) with the TLS trust store loaded once.

`httpx.get()` builds a client per call, and with it an SSL context that loads
the CA bundle: about 25 ms of CPU per call, even to a plain-HTTP URL. The
loops that wait for a process to come up, poll a gateway's routable count or
watch a drill call it several times a second, and on a two-core machine that
CPU comes out of the processes being waited on (measured: one test waiting on
a gateway took 0.7 of a core). With the context built once per process a call
costs about 1.5 ms. Code that talks to one host often should hold an
`httpx.Client`; these are for the calls that do not. An explicit `verify=`
is passed through.
"""

from __future__ import annotations

import functools
import ssl
from typing import Any

import httpx


@functools.cache
def trust() -> ssl.SSLContext:
    """The process's one default SSL context (httpx's: certifi, or `SSL_CERT_FILE` / `SSL_CERT_DIR`)."""
    return httpx.create_ssl_context()


def request(method: str, url: str, **kwargs: Any) -> httpx.Response:
    kwargs.setdefault("verify", trust())
    return httpx.request(method, url, **kwargs)


def get(url: str, **kwargs: Any) -> httpx.Response:
    return request("GET", url, **kwargs)


def post(url: str, **kwargs: Any) -> httpx.Response:
    return request("POST", url, **kwargs)


def put(url: str, **kwargs: Any) -> httpx.Response:
    return request("PUT", url, **kwargs)


def delete(url: str, **kwargs: Any) -> httpx.Response:
    return request("DELETE", url, **kwargs)


def stream(method: str, url: str, **kwargs: Any) -> Any:
    """`httpx.stream`: a context manager whose response is read as it arrives."""
    kwargs.setdefault("verify", trust())
    return httpx.stream(method, url, **kwargs)
