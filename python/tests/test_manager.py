"""KvCacheManager: the C++ names, zero-copy read-only block tables, statuses for capacity."""

import gc

import numpy as np
import pytest

import mixkv

BLOCK = 16
WINDOW = 128


@pytest.fixture(scope="module")
def swa_plan():
    # gpt-oss-20b: group 0 sliding (window 128), group 1 full attention, blocks of 16 tokens.
    return mixkv.plan("gpt-oss-20b", memory="256MiB", max_model_len=2048, request_len=1024)


def groups_by(plan, behaviour):
    return [g.id for g in plan.kv_cache_groups if g.behaviour == behaviour]


def test_block_table_is_a_read_only_view_of_the_managers_storage(swa_plan):
    m = mixkv.KvCacheManager(swa_plan, num_spec_tokens=2)
    m.add_request(7, list(range(40)))
    assert m.admit(7, lookahead=2) == 0
    for group in range(m.num_groups):
        table = m.block_table(7, group)
        assert table.dtype == np.int32 and table.ndim == 1
        assert table.__array_interface__["data"][0] == m._table_address(7, group)
        assert not table.flags.writeable and not table.flags.owndata
        with pytest.raises(ValueError):
            table[0] = 5
    # 40 prompt tokens + 2 look-ahead: 3 blocks of 16, all distinct across the groups' pool.
    blocks = np.concatenate([m.block_table(7, g) for g in range(m.num_groups)])
    assert len(blocks) == 6 and len(set(blocks.tolist())) == 6 and 0 not in blocks
    assert m.check_invariants() == ""


def test_view_follows_the_manager_until_the_table_grows(swa_plan):
    m = mixkv.KvCacheManager(swa_plan, num_spec_tokens=0)
    (sliding,) = groups_by(swa_plan, "sliding")
    prompt = list(range(1, 2 * WINDOW + 1))  # 256 tokens: 16 blocks
    m.add_request(1, prompt)
    assert m.admit(1, 0) == 0
    view = m.block_table(1, sliding)
    before = view.copy()
    assert (before != 0).all()
    # Committing the prompt: blocks that left the 128-token window are freed in place, and the
    # view shows it with no new call; the storage has not moved.
    m.commit(1, len(prompt), [])
    assert m._table_address(1, sliding) == view.__array_interface__["data"][0]
    assert view[0] == 0 and (view[: len(view) - WINDOW // BLOCK - 1] == 0).all()
    assert (view[-(WINDOW // BLOCK):] == before[-(WINDOW // BLOCK):]).all()
    assert m.check_invariants() == ""
    # Decode steps: a fresh view after each allocate is again the manager's storage.
    for step in range(40):
        assert m.allocate(1, 1, 0)
        view = m.block_table(1, sliding)
        assert view.__array_interface__["data"][0] == m._table_address(1, sliding)
        m.commit(1, 1, [step])
        assert m.num_computed(1) == len(prompt) + step + 1
    assert m.check_invariants() == ""


def test_a_view_keeps_the_manager_alive(swa_plan):
    m = mixkv.KvCacheManager(swa_plan)
    m.add_request(3, [1] * 33)
    m.admit(3)
    view = m.block_table(3, 1)
    expected = view.copy()
    del m
    gc.collect()
    assert (view == expected).all()


def test_capacity_is_a_status_not_an_exception(swa_plan):
    m = mixkv.KvCacheManager(swa_plan)
    admitted = 0
    for i in range(10_000):
        m.add_request(i, [i % 50000] * 1000)
        if m.admit(i) is None:
            break
        admitted += 1
    else:
        pytest.fail("the pool never filled")
    assert admitted > 0 and m.num_free_blocks < 1000 // BLOCK * 2
    assert m.check_invariants() == ""
    m.free(admitted)
    for i in range(admitted):
        m.free(i)
    assert m.num_used_blocks == 0 and m.num_requests == 0


def test_prefix_hits_and_stats(swa_plan):
    m = mixkv.KvCacheManager(swa_plan)
    prompt = list(range(100, 200))
    m.add_request(1, prompt)
    m.admit(1)
    m.commit(1, len(prompt), [])
    m.add_request(2, np.array(prompt + [5, 6], dtype=np.int64))
    assert m.find_prefix_hit(2) == 96  # full blocks, all of them inside the window
    assert m.admit(2) == 96
    stats = m.stats()
    assert [s["group"] for s in stats] == list(range(m.num_groups))
    assert all(s["hit_tokens"] == 96 for s in stats)
    assert m.check_invariants() == ""


def test_slot_mapping_follows_the_geometry(swa_plan):
    m = mixkv.KvCacheManager(swa_plan)
    m.add_request(1, list(range(40)))
    m.admit(1)
    layer = swa_plan.geometry.layers[1]  # full attention
    slots = m.slot_mapping(1, layer.layer, 0, 40)
    table = m.block_table(1, layer.kv_cache_group)
    k = layer.kernel_pages_per_block
    kt = layer.kernel_tokens
    expected = [(table[p // layer.block_tokens] * k + (p % layer.block_tokens) // kt) * kt + p % kt
                for p in range(40)]
    assert slots.tolist() == expected and slots.flags.owndata is False and slots.flags.writeable


def test_recurrent_groups_report_their_step():
    plan = mixkv.plan("qwen3.5-27b", draft="mtp", memory="4GiB", max_model_len=4096,
                      request_len=2048)
    m = mixkv.KvCacheManager(plan, num_spec_tokens=1)
    (rec, *_) = groups_by(plan, "recurrent")
    m.add_request(1, list(range(300)))
    assert m.admit(1, 1) == 0
    step = m.recurrent_step(1, rec)
    assert set(step) == {"restore_from", "snapshot_at", "snapshot"}
    assert len(m.block_table(1, rec)) >= 2  # the live state and a checkpoint per spec token
    assert m.snapshot_interval > 0
    with pytest.raises(mixkv.InvalidInput):
        m.recurrent_step(1, [g.id for g in plan.kv_cache_groups if g.behaviour != "recurrent"][0])
