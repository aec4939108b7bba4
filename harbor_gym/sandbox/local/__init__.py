"""The ``local`` sandbox backend: bubblewrap over an unpacked root filesystem with a writable overlay, no daemon.

``harbor_gym.sandbox.open(spec, backend="local")`` builds `LocalSandbox(spec, settings)`. See `sandbox.py` for what
a local sandbox is and what it refuses; `collect_local_garbage` removes what crashed runs left behind.
"""

from harbor_gym.sandbox.local._gc import collect_local_garbage
from harbor_gym.sandbox.local.sandbox import LocalSandbox, local_root, local_unavailable_reason

__all__ = ["LocalSandbox", "collect_local_garbage", "local_root", "local_unavailable_reason"]
