"""Prints issue 14's points from a kernels sitting (scripts/bench-kernels-sitting.sh).

usage: python3 scripts/kernels_sitting.py DIR

DIR holds round_R_G.json: round R's invocation G of `mixkv_bench` (--benchmark_out, JSON), each
a group of the sitting's benchmarks beside BM_StreamRead/threads:2 and BM_CoreRoundTrip. Every
point is a ratio within one invocation (a kernel's bytes a second against that invocation's
streaming read, or its time against the same kernel's one-row time), because the host's bandwidth
can move by a fifth from minute to minute; the last columns are the median over rounds and
whether it meets what issue 14 asks (over every round), and beside them the median over the
"near" rounds alone. A round is "near" when every round trip it measured read under FAR_NS, "far"
when every one read over it, "moved" otherwise: the host may place the two threads on cores far
apart, and the shares move with that by more than with most kernel changes.
"""

import json
import pathlib
import statistics
import sys

FAR_NS = 200.0  # near reads 70-130 ns on the Zen 4 and Zen 5 measured so far, far 340-430


def load_round(paths):
    """name (without /real_time or /manual_time) -> the benchmark's JSON entry, with the bytes a
    second of the streaming read of its own invocation ("stream"); and the round's round trips."""
    entries, trips = {}, []
    for path in paths:
        invocation = {}
        for b in json.loads(path.read_text())["benchmarks"]:
            if b.get("run_type", "iteration") != "iteration":
                continue
            invocation[b["name"].replace("/real_time", "").replace("/manual_time", "")] = b
        stream = invocation.pop("BM_StreamRead/threads:2", None)
        for name, b in invocation.items():
            if name.startswith("BM_CoreRoundTrip"):
                trips.append(b["round_trip_ns"])
            else:
                b["stream"] = stream["bytes_per_second"] if stream else None
                entries[name] = b
    return entries, trips


def seconds(entry):
    scale = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}[entry["time_unit"]]
    return entry["real_time"] * scale


# How a point is judged: a share of the streaming read that must reach `bound`, or a ratio of
# times that must stay under it.
SHARE, RATIO = "share", "ratio"


def points(round_):
    """(label, value, form, bound) for every point of issue 14; value None where not measured."""
    out = []

    def share(name):  # bytes a second against its invocation's streaming read
        e = round_.get(name)
        if e is None or not e["stream"]:
            return None
        return e["bytes_per_second"] / e["stream"]

    def ratio(num, den):  # time of one benchmark over another's
        a, b = round_.get(num), round_.get(den)
        return None if a is None or b is None else seconds(a) / seconds(b)

    for dtype in ("bfloat16", "fp8_e4m3"):
        for ctx in (8192, 32768):
            contiguous = f"BM_Decode/contiguous/{dtype}/ctx:{ctx}/threads:2"
            for pages in ("paged", "paged_hnd"):  # NHD and HND pages
                paged = f"BM_Decode/{pages}/{dtype}/ctx:{ctx}/threads:2"
                out.append((f"{pages} {dtype} decode, {ctx // 1024}k: % of streaming",
                            share(paged), SHARE, 0.70))
                out.append((f"{pages} / contiguous {dtype}, {ctx // 1024}k",
                            ratio(paged, contiguous), RATIO, 1.10))
    for order in ("bfloat16", "bfloat16_pairs", "fp8_e4m3", "fp8_e4m3_pairs"):
        base = f"BM_DecodeMultiRow/{order}/rows:{{}}/ctx:8192/threads:2"
        out.append((f"5 verify rows / 1 row, {order}, 8k", ratio(base.format(5), base.format(1)),
                    RATIO, 1.30))
    for wtype in ("bfloat16", "q8_0", "q4_1"):
        for order in ("", "_blocksum"):
            base = f"BM_WeightMatmul/{wtype}{order}/rows:{{}}/threads:2"
            label = f"{wtype} weights, {'blocksum' if order else 'ggml'} order"
            out.append((f"{label}: 1 row, % of streaming", share(base.format(1)), SHARE, 0.80))
            out.append((f"{label}: 8 rows / 1 row", ratio(base.format(8), base.format(1)),
                        RATIO, 1.30))
    return out


def shown(value, form):
    if value is None:
        return "-"
    return f"{value:.0%}" if form == SHARE else f"{value:.2f}x"


def main(folder):
    rounds, heads, near = [], [], []
    r = 1
    while paths := sorted(folder.glob(f"round_{r}_*.json")):
        round_, trips = load_round(paths)
        streams = sorted({e["stream"] for e in round_.values() if e["stream"]})
        gib = (f"read {streams[0] / 2**30:.0f}-{streams[-1] / 2**30:.0f} GiB/s" if streams
               else "no streaming read")
        if trips:
            where = ("near" if max(trips) < FAR_NS else "far" if min(trips) >= FAR_NS
                     else "moved") + f", {min(trips):.0f}-{max(trips):.0f} ns"
        else:
            where = "placement unmeasured"
        rounds.append(round_)
        near.append(where.startswith("near"))
        heads.append(f"round {r} ({gib}, {where})")
        r += 1
    if not rounds:
        sys.exit(f"mixkv: no round_1_*.json in {folder}")
    table = [points(round_) for round_ in rounds]
    print("| point | " + " | ".join(heads) + " | median | asked | met | median of near rounds |")
    print("|---|" + "---|" * (len(rounds) + 4))
    for k, (label, _, form, bound) in enumerate(table[0]):
        values = [row[k][1] for row in table]
        measured = [v for v in values if v is not None]
        if not measured:
            continue
        mid = statistics.median(measured)
        met = mid >= bound if form == SHARE else mid <= bound
        asked = (">= " if form == SHARE else "<= ") + shown(bound, form)
        quiet = [v for v, n in zip(values, near) if n and v is not None]
        near_mid = shown(statistics.median(quiet), form) if quiet else "-"
        print(f"| {label} | " + " | ".join(shown(v, form) for v in values) +
              f" | {shown(mid, form)} | {asked} | {'yes' if met else 'no'} | {near_mid} |")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(pathlib.Path(sys.argv[1]))
