"""The model-call capture proxy (issue 18): harnesses that run inside a sandbox call their model through it, and
every call is recorded, with the upstream's token ids and logprobs, in the activation window it was made in.

Layer: between ``agents/`` (whose `ModelCall` it records, and whose wire module `harbor_gym.agents._chat_wire` it
reuses) and ``episode/`` (which opens a session per episode and a window per turn's agent activation).

Use::

    upstream = ModelUpstream(base_url="http://127.0.0.1:8000/v1", api_key_env="OPENAI_API_KEY", model="policy")
    proxy = shared_proxy(upstream, addresses=("127.0.0.1",))
    session = proxy.open_session(label="task-1")        # the sandbox gets session.token as its API key
    session.begin_activation(turn_index=0)                # and session.base_url_for("IP:PORT") as its base URL
    ...                                                   # the harness calls the model
    calls = session.end_activation()                      # calls.calls: the ModelCalls, in order
    session.close()

Protocols: OpenAI Chat Completions (plain and streamed) and Anthropic Messages (plain and streamed), translated to
the OpenAI upstream (`harbor_gym.proxy._anthropic`). Caps: `ProxyLimits` (SPEC GYM-10).
"""

from harbor_gym.proxy._config import ModelUpstream, ProxyLimits
from harbor_gym.proxy._server import CaptureProxy, shared_proxy
from harbor_gym.proxy._session import ActivationCalls, ProxyError, ProxySession, ProxyStateError

__all__ = [
    "ModelUpstream",
    "ProxyLimits",
    "CaptureProxy",
    "shared_proxy",
    "ProxySession",
    "ActivationCalls",
    "ProxyError",
    "ProxyStateError",
]
