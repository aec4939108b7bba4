"""ATIF trajectory document (SPEC VER-10): pure, no Docker."""

import pytest

from harbor_gym.agents import TrajectoryError, build_trajectory, validate_trajectory


# SPEC: VER-10
def test_ver_10_built_document_validates():
    doc = build_trajectory("do it", {"name": "a", "version": "1"}, [
        {"source": "agent", "message": "ok", "model_name": "m",
         "tool_calls": [{"tool_call_id": "c1", "function_name": "bash", "arguments": {"cmd": "ls"}}],
         "observation": {"results": [{"source_call_id": "c1", "content": "x"}, {"source_call_id": "zz"}]},
         "junk": 1},
        {"source": "system", "message": "note", "model_name": "m"},
    ])
    validate_trajectory(doc)
    assert doc["schema_version"] == "ATIF-v1.7"
    assert [s["step_id"] for s in doc["steps"]] == [1, 2, 3]
    assert doc["steps"][0]["source"] == "user" and doc["steps"][0]["message"] == "do it"
    assert "model_name" not in doc["steps"][2] and "junk" not in doc["steps"][1]


# SPEC: VER-10
@pytest.mark.parametrize("mutate", [
    lambda d: d.update(extra_key=1),
    lambda d: d.update(schema_version="ATIF-v1.0"),
    lambda d: d["steps"].clear(),
    lambda d: d["steps"][0].update(step_id=2),
    lambda d: d["steps"][0].update(source="agent"),
    lambda d: d["steps"][0].update(model_name="m"),
    lambda d: d["steps"][0].update(timestamp="yesterday"),
    lambda d: d["agent"].pop("version"),
])
def test_ver_10_violations_refused(mutate):
    doc = build_trajectory("x", {"name": "a", "version": "1"})
    mutate(doc)
    with pytest.raises(TrajectoryError):
        validate_trajectory(doc)
