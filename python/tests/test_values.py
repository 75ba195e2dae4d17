"""Value types: frozen, equal by document, to_dict / from_dict round trips."""

import pickle

import pytest

import mixkv


@pytest.fixture(scope="module")
def plan():
    return mixkv.plan("gpt-oss-20b", draft="eagle3-gpt-oss-20b", memory="8GiB")


def test_values_are_frozen(plan):
    with pytest.raises(AttributeError):
        plan.pools = ()
    with pytest.raises(AttributeError):
        plan.concurrency.max_requests = 1
    assert isinstance(plan.pools, tuple)


def test_to_dict_is_a_copy_and_from_dict_round_trips(plan):
    d = plan.to_dict()
    d["pools"].clear()
    assert plan.to_dict()["pools"]
    again = mixkv.Plan.from_dict(plan.to_dict())
    assert again == plan and hash(again) == hash(plan)
    assert again.memory_note is None and plan.memory_note.startswith("KV memory given")
    assert pickle.loads(pickle.dumps(plan)) == plan


def test_unknown_field_names_the_fields(plan):
    with pytest.raises(AttributeError, match="its fields are .*concurrency"):
        plan.no_such_field


def test_plan_knows_its_model(plan):
    assert plan.model == mixkv.describe("gpt-oss-20b", draft="eagle3-gpt-oss-20b")


def test_from_dict_refuses_what_is_not_a_dict():
    with pytest.raises(mixkv.InvalidInput):
        mixkv.Plan.from_dict([1, 2])
