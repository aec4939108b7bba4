"""ATIF trajectories: build the per-turn ``/logs/agent/trajectory.json`` document and validate one (SPEC VER-10).

A document is ``{schema_version: "ATIF-v1.7", session_id, agent: {name, version[, model_name]}, steps}`` with
``steps`` non-empty and numbered 1, 2, …; step 1 is the ``user`` step holding the instruction. Only ``agent`` steps
may carry ``model_name``, ``reasoning_content``, ``tool_calls`` and ``metrics``; every
``observation.results[].source_call_id`` names a tool call of its own step; timestamps are ISO 8601; no extra keys.
"""

from __future__ import annotations

import datetime as _dt
import math
import uuid
from typing import Any, Iterable, Mapping

__all__ = ["ATIF_VERSION", "build_trajectory", "validate_trajectory", "TrajectoryError"]

ATIF_VERSION = "ATIF-v1.7"

_TOP_KEYS = {"schema_version", "session_id", "agent", "steps", "notes", "final_metrics", "extra"}
_AGENT_KEYS = {"name", "version", "model_name", "extra"}
_STEP_KEYS = {"step_id", "timestamp", "source", "message", "model_name", "reasoning_content", "tool_calls",
              "observation", "metrics", "extra"}
_AGENT_ONLY = {"model_name", "reasoning_content", "tool_calls", "metrics"}
_TOOL_KEYS = {"tool_call_id", "function_name", "arguments"}
_SOURCES = {"user", "agent", "system"}


class TrajectoryError(ValueError):
    """A trajectory violates VER-10; the message names the step and the key."""


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat()


def build_trajectory(
    instruction: str,
    agent: Mapping[str, str],
    steps: Iterable[Mapping[str, Any]] | None = None,
    *,
    session_id: str | None = None,
) -> dict[str, Any]:
    """VER-10: this turn's ATIF document: the ``user`` step with ``instruction``, then ``steps`` renumbered.

    Steps the agent reported that break VER-10 are reduced to their valid keys (unknown keys dropped, agent-only
    keys removed from non-agent steps, a missing message made ``""``), so the document always validates.

    Returns:
        A JSON-able dict that `validate_trajectory` accepts.
    """
    doc_steps: list[dict[str, Any]] = [
        {"step_id": 1, "timestamp": _now(), "source": "user", "message": instruction}
    ]
    for raw in steps or ():
        step = {k: v for k, v in dict(raw).items() if k in _STEP_KEYS}
        source = step.get("source") if step.get("source") in _SOURCES else "agent"
        step["source"] = source
        step["step_id"] = len(doc_steps) + 1
        if not isinstance(step.get("message"), str):
            step["message"] = "" if step.get("message") is None else str(step["message"])
        if not _is_iso(step.get("timestamp")):
            step.pop("timestamp", None)
        if source != "agent":
            for key in _AGENT_ONLY:
                step.pop(key, None)
        if "tool_calls" in step:
            calls = [
                {k: c[k] for k in _TOOL_KEYS if k in c}
                for c in step["tool_calls"] or ()
                if isinstance(c, Mapping) and {"tool_call_id", "function_name"} <= set(c)
            ]
            for c in calls:
                c.setdefault("arguments", {})
            step["tool_calls"] = calls
        if "observation" in step:
            ids = {c["tool_call_id"] for c in step.get("tool_calls", ())}
            obs = step["observation"] if isinstance(step["observation"], Mapping) else {}
            results = [dict(r) for r in obs.get("results", ()) if isinstance(r, Mapping)]
            for r in results:
                if "source_call_id" in r and r["source_call_id"] not in ids:
                    r.pop("source_call_id")
            step["observation"] = {"results": results}
        doc_steps.append(step)
    return {
        "schema_version": ATIF_VERSION,
        "session_id": session_id or str(uuid.uuid4()),
        "agent": {k: str(v) for k, v in agent.items() if k in _AGENT_KEYS and k != "extra"},
        "steps": doc_steps,
    }


def _is_iso(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    try:
        _dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return False
    return True


def validate_trajectory(doc: Any) -> None:
    """Check ``doc`` against VER-10.

    Raises:
        TrajectoryError: the first violation, naming the step and key.
    """
    if not isinstance(doc, Mapping):
        raise TrajectoryError("trajectory is not a JSON object (VER-10)")
    extra = set(doc) - _TOP_KEYS
    if extra:
        raise TrajectoryError(f"unknown top-level keys {sorted(extra)} (VER-10)")
    if doc.get("schema_version") != ATIF_VERSION:
        raise TrajectoryError(f"schema_version must be {ATIF_VERSION!r} (VER-10)")
    if not isinstance(doc.get("session_id"), str) or not doc["session_id"]:
        raise TrajectoryError("session_id must be a non-empty string (VER-10)")
    agent = doc.get("agent")
    if not isinstance(agent, Mapping) or not {"name", "version"} <= set(agent) or set(agent) - _AGENT_KEYS:
        raise TrajectoryError("agent must be {name, version[, model_name]} (VER-10)")
    steps = doc.get("steps")
    if not isinstance(steps, list) or not steps:
        raise TrajectoryError("steps must be a non-empty list (VER-10)")
    for i, step in enumerate(steps, start=1):
        where = f"steps[{i - 1}]"
        if not isinstance(step, Mapping):
            raise TrajectoryError(f"{where} is not an object (VER-10)")
        if set(step) - _STEP_KEYS:
            raise TrajectoryError(f"{where}: unknown keys {sorted(set(step) - _STEP_KEYS)} (VER-10)")
        if step.get("step_id") != i:
            raise TrajectoryError(f"{where}: step_id must be {i} (VER-10)")
        if step.get("source") not in _SOURCES:
            raise TrajectoryError(f"{where}: source must be user|agent|system (VER-10)")
        if not isinstance(step.get("message"), str):
            raise TrajectoryError(f"{where}: message must be a string (VER-10)")
        if "timestamp" in step and not _is_iso(step["timestamp"]):
            raise TrajectoryError(f"{where}: timestamp must be ISO 8601 (VER-10)")
        if step["source"] != "agent" and _AGENT_ONLY & set(step):
            raise TrajectoryError(f"{where}: {sorted(_AGENT_ONLY & set(step))} only on agent steps (VER-10)")
        ids = set()
        for call in step.get("tool_calls") or ():
            if not isinstance(call, Mapping) or set(call) != _TOOL_KEYS:
                raise TrajectoryError(f"{where}: a tool call must be {sorted(_TOOL_KEYS)} (VER-10)")
            ids.add(call["tool_call_id"])
        obs = step.get("observation")
        if obs is not None:
            for r in obs.get("results", ()) if isinstance(obs, Mapping) else ():
                if "source_call_id" in r and r["source_call_id"] not in ids:
                    raise TrajectoryError(f"{where}: source_call_id {r['source_call_id']!r} names no tool call "
                                          "of its step (VER-10)")
        metrics = step.get("metrics")
        if isinstance(metrics, Mapping):
            for k, v in metrics.items():
                if isinstance(v, float) and not math.isfinite(v):
                    raise TrajectoryError(f"{where}: metrics.{k} is not finite (VER-10)")
    if steps[0].get("source") != "user":
        raise TrajectoryError("steps[0] must be the user step with the instruction (VER-10)")
