"""Will my deployment fit? Plans a target and its drafter on each GPU and tensor-parallel size
with both policies, and prints how many requests of the workload's length each one holds.

    python deployment_fit.py qwen3.5-27b --draft dflash-qwen3.5-27b --request-len 8192
"""

import argparse

import mixkv


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", nargs="?", default="qwen3.5-27b")
    p.add_argument("--draft", default="dflash-qwen3.5-27b")
    p.add_argument("--gpus", default="h100,h200,b200,b300")
    p.add_argument("--tp", default="1,2,4")
    p.add_argument("--request-len", type=int, default=2500)
    a = p.parse_args()
    print(f"{a.model} + {a.draft or 'no drafter'}, requests of {a.request_len} tokens\n")
    print(f"{'gpu':<5} {'tp':>2} {'KV GiB':>8} {'vllm':>7} {'mixkv':>7} {'limit':>7} "
          f"{'of limit':>8}  note")
    for gpu in a.gpus.split(","):
        for tp in map(int, a.tp.split(",")):
            try:
                c = mixkv.compare(a.model, a.draft or None, gpu=gpu, tp=tp,
                                  request_len=a.request_len)
            except mixkv.CapacityError as e:
                print(f"{gpu:<5} {tp:>2} {'-':>8} {'-':>7} {'-':>7} {'-':>7} {'-':>8}  "
                      f"does not fit: {str(e).split(';')[0]}")
                continue
            except mixkv.InvalidInput as e:
                print(f"{gpu:<5} {tp:>2}  {e}")
                continue
            m = c.mixkv.concurrency
            vllm = "fails" if c.vllm is None else f"{c.vllm.concurrency.max_requests:.0f}"
            print(f"{gpu:<5} {tp:>2} {c.mixkv.memory_bytes / 2**30:>8.1f} {vllm:>7} "
                  f"{m.max_requests:>7.0f} {m.physical_limit:>7.0f} {m.efficiency:>8.1%}")


if __name__ == "__main__":
    main()
