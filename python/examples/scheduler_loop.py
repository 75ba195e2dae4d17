"""A speculative-decoding scheduler loop in Python over mixkv's KvCacheManager, checking the
manager's invariants after every step.

    python scheduler_loop.py [--requests 64] [--k 3] [--steps 200]
"""

import argparse
import random

import mixkv

p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
p.add_argument("--requests", type=int, default=64)
p.add_argument("--k", type=int, default=3, help="draft tokens per step")
p.add_argument("--steps", type=int, default=200)
a = p.parse_args()
rng = random.Random(0)
plan = mixkv.plan("gpt-oss-20b", draft="eagle3-gpt-oss-20b", num_spec_tokens=a.k,
                  memory="512MiB", max_model_len=2048, request_len=1024)
m = mixkv.KvCacheManager(plan, num_spec_tokens=a.k)
waiting = list(range(a.requests))
running, computed, done = {}, {}, 0  # id -> tokens left to generate / verified KV
prompts = {i: [rng.randrange(1, 200) for _ in range(rng.randrange(20, 400))] for i in waiting}
for step in range(a.steps):
    while waiting:  # admission, all or nothing, FIFO
        i = waiting[0]
        m.add_request(i, prompts[i])
        if m.admit(i, a.k) is None:
            m.free(i)
            break
        waiting.pop(0)
        m.commit(i, len(prompts[i]), [rng.randrange(200)])  # the prefill and its first token
        running[i], computed[i] = rng.randrange(8, 128), len(prompts[i])
    for i in list(running):  # room for the last token plus k drafts, or preempt
        if not m.allocate(i, 1, a.k):
            m.free(i)
            del running[i]
            waiting.append(i)  # recomputed from its prompt later
    for i in list(running):  # "forward": the target accepts a prefix of the drafts
        accepted = min(rng.randrange(a.k + 1), running[i] - 1)
        table = m.block_table(i, 0)  # zero copy: what a kernel would be handed
        assert len(table) * 16 >= computed[i] + 1 + a.k or plan.kv_cache_groups[0].window
        m.commit(i, accepted + 1, [rng.randrange(200)] * (accepted + 1), accepted)
        computed[i] += accepted + 1
        running[i] -= accepted + 1
        assert m.num_computed(i) == computed[i]
        if running[i] <= 0:
            m.free(i)
            del running[i], computed[i]
            done += 1
    problem = m.check_invariants()
    assert problem == "", f"step {step}: {problem}"
    assert m.num_free_blocks + m.num_used_blocks == m.num_blocks - 1
    if not running and not waiting:
        break
for i in running:
    m.free(i)
print(f"{step + 1} steps, {done} requests finished, {len(waiting)} waiting, "
      f"{m.num_used_blocks} blocks held after freeing the rest; invariants held at every step")
assert m.num_used_blocks == 0
