"""FMT-2 canary stripping and FMT-15 env templates."""

from __future__ import annotations

import pickle

import pytest

from harbor_gym.errors import EnvTemplateError, SeedRefusedError
from harbor_gym.task import load_task, resolve_env_templates, strip_canary

from .conftest import FIXTURES


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<!-- canary GUID 123 -->\n\nDo it.\n", "Do it.\n"),
        ("# BENCHMARK DATA. terminal-bench-CANARY GUID x\n\n\nDo it.\n", "Do it.\n"),
        ("<!-- Canary -->\n# canary 2\n\nDo it.\n", "Do it.\n"),
        ("<!--\n  canary GUID\n-->\n\nDo it.\n", "Do it.\n"),
        ("\n<!-- canary -->\nDo it.\n", "Do it.\n"),
        ("Do it.\n# canary later\n", "Do it.\n# canary later\n"),
        ("# Title\n\nDo it.\n", "# Title\n\nDo it.\n"),
        ("<!-- just a comment -->\nDo it.\n", "<!-- just a comment -->\nDo it.\n"),
        ("<!-- canary --> trailing text\nDo it.\n", "<!-- canary --> trailing text\nDo it.\n"),
        ("<!-- canary never closed\nDo it.\n", "<!-- canary never closed\nDo it.\n"),
        ("# canary\n", ""),
        ("", ""),
        ("Do it.\n\n  indented\n", "Do it.\n\n  indented\n"),
    ],
)
def test_fmt_2_canary_lines(text, expected):
    # SPEC: FMT-2
    assert strip_canary(text) == expected


def test_fmt_2_applied_to_loaded_instructions():
    # SPEC: FMT-2, TURN-9
    assert load_task(FIXTURES / "single-minimal").steps[0].instruction == "Write `hello` to /app/out.txt.\n"
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert load_task(FIXTURES / "legacy").steps[0].instruction == "Do the only step.\n"


def test_fmt_15_templates():
    # SPEC: FMT-15
    env = {
        "A": "${HOME_X}",
        "B": "${MISSING:-fallback}",
        "C": "literal ${HOME_X}",
        "D": "$HOME_X",
        "E": "${EMPTY:-d}",
        "F": "${EMPTY}",
        "G": "${MISSING:-}",
    }
    host = {"HOME_X": "/h", "EMPTY": ""}
    assert resolve_env_templates(env, host) == {
        "A": "/h",
        "B": "fallback",
        "C": "literal ${HOME_X}",
        "D": "$HOME_X",
        "E": "d",
        "F": "",
        "G": "",
    }


def test_load_23_unset_variable_error_names_it():
    # SPEC: LOAD-23 (used at seed) — a distinct error naming the variable and the key
    with pytest.raises(EnvTemplateError) as excinfo:
        resolve_env_templates({"TOKEN": "${API_TOKEN}"}, {})
    err = excinfo.value
    assert isinstance(err, SeedRefusedError)
    assert err.variable == "API_TOKEN" and err.field == "TOKEN" and err.rule == "LOAD-23"
    assert "API_TOKEN" in str(err) and "LOAD-23" in str(err)
    again = pickle.loads(pickle.dumps(err))
    assert again.variable == "API_TOKEN" and str(again) == str(err)
