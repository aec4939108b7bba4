"""Property (LOAD-1): any task.toml text either loads (and round-trips) or raises TaskLoadError."""

from __future__ import annotations

import copy
import tomllib
import warnings

import tomli_w
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harbor_gym.errors import TaskLoadError
from harbor_gym.task import dump_task_toml, load_task

from .conftest import FIXTURES, TEST_SH, write_tree

BASES = [(FIXTURES / name / "task.toml").read_text() for name in ("multi-full", "legacy", "single-minimal")]

toml_scalars = st.one_of(
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(
        [
            "shared",
            "separate",
            "public",
            "no-network",
            "allowlist",
            "mean",
            "final",
            "linux",
            "windows",
            "2G",
            "512M",
            "/abs",
            "../up",
            "manifest.json",
            "db",
            "main",
            "one",
            "*.a.com",
            "${X}",
        ]
    ),
)
toml_values = st.recursive(
    toml_scalars,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=6,
)


def _paths(data, prefix=()):
    """Every (path) into nested dicts/lists of ``data``."""
    yield prefix
    if isinstance(data, dict):
        for key, value in data.items():
            yield from _paths(value, (*prefix, key))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            yield from _paths(value, (*prefix, i))


@st.composite
def mutated_dicts(draw):
    base = tomllib.loads(draw(st.sampled_from(BASES)))
    data = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p in _paths(data) if p]
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = data
        for part in path[:-1]:
            parent = parent[part]
        if draw(st.booleans()) and isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent[path[-1]] = draw(toml_values)
    return tomli_w.dumps(data)


@st.composite
def mutated_texts(draw):
    text = draw(st.sampled_from(BASES))
    for _ in range(draw(st.integers(1, 4))):
        pos = draw(st.integers(0, len(text)))
        if draw(st.booleans()):
            end = draw(st.integers(pos, min(len(text), pos + 20)))
            text = text[:pos] + text[end:]
        else:
            text = (
                text[:pos]
                + draw(st.text(alphabet='[]{}="\n .,#-0123456789abcdefx_', max_size=6))
                + text[pos:]
            )
    return text


def _check(folder, text):
    (folder / "task.toml").write_text(text)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            task = load_task(folder)
        except TaskLoadError as exc:
            assert exc.rule and exc.rule.startswith("LOAD-") and str(folder) in str(exc)
            return
        (folder / "task.toml").write_text(dump_task_toml(task.config))
        # compared by repr: free [metadata] may hold NaN, which never equals itself, while its repr round-trips
        assert repr(load_task(folder).config) == repr(task.config)


def _folder(tmp_path_factory):
    files = {
        "instruction.md": "x\n",
        "tests/test.sh": TEST_SH,
        "environment/Dockerfile": "FROM x\n",
        "environment/docker-compose.yaml": "services: {main: {image: x}, db: {image: postgres}}\n",
        "solution/solve.sh": "true\n",
    }
    for step in ("01-setup", "02-finish", "only", "one"):
        files[f"steps/{step}/instruction.md"] = "x\n"
    return write_tree(tmp_path_factory.mktemp("fuzz") / "task", files)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=mutated_dicts())
def test_load_1_mutated_tables_load_or_refuse(tmp_path_factory, text):
    # SPEC: LOAD-1 — a wrong type or value is a TaskLoadError, never another exception
    _check(_folder(tmp_path_factory), text)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=mutated_texts())
def test_load_1_mutated_text_loads_or_refuses(tmp_path_factory, text):
    # SPEC: LOAD-1
    _check(_folder(tmp_path_factory), text)
