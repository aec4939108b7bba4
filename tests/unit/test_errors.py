"""The error hierarchy: one root, messages built from where/what/rule, and errors that pickle (vector envs)."""

from __future__ import annotations

import pickle

import pytest

from harbor_gym import errors


def test_every_error_derives_from_the_root():
    for name in errors.__all__:
        assert issubclass(getattr(errors, name), errors.HarborGymError)


def test_message_names_path_field_and_rule():
    exc = errors.TaskLoadError("step folder missing", path="/t/task.toml", field="steps[0]", rule="LOAD-3")
    assert str(exc) == "/t/task.toml: steps[0]: step folder missing [LOAD-3]"


def test_builtin_compatibility_where_spec_names_one():
    assert issubclass(errors.ResetNeededError, RuntimeError)  # SPEC: GYM-7
    assert issubclass(errors.SessionMismatchError, ValueError)  # SPEC: SES-3


@pytest.mark.parametrize("cls", [errors.SeedError, errors.SandboxError, errors.TaskLoadError])
def test_errors_pickle_with_their_attributes(cls):
    exc = cls("boom", path="/x", field="f", rule="GYM-2", retryable=True)
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is cls
    assert (back.reason, str(back.path), back.field, back.rule, back.retryable) == ("boom", "/x", "f", "GYM-2", True)
    assert str(back) == str(exc)
