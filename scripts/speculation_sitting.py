"""Prints the table of a speculation sitting (scripts/bench-speculation-sitting.sh) from its files.

usage: python3 scripts/speculation_sitting.py DIR

DIR holds builtin_R.json and heldout_R.json (`mixkv bench-generate --json`), llamacpp_R.json where
llama.cpp ran (scripts/bench-llamacpp-generate.sh --json), and batch1_I.json / batch16_I.json.
Decode tokens/s throughout (the tokens after each request's first). A round is "near" when both
of bench-generate's cache-line round trips read under FAR_NS, "far" when both read over it.
"""

import json
import pathlib
import statistics
import sys

FAR_NS = 200.0  # near reads 50-100 ns on the machines measured so far, far 340-380


def load(path):
    return json.loads(path.read_text()) if path.exists() else None


def by_category(report):
    return {c["category"]: c for c in report["categories"]}


def placement(report):
    trip = report.get("thread_round_trip_ns") or {}
    values = [trip.get("before"), trip.get("after")]
    if any(v is None for v in values):
        return "unmeasured", values
    if all(v < FAR_NS for v in values):
        return "near", values
    if all(v >= FAR_NS for v in values):
        return "far", values
    return "moved", values


def fmt(value, spec=".2f", suffix=""):
    return "-" if value is None else f"{value:{spec}}{suffix}"


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def main(folder):
    rows = []
    r = 1
    while (folder / f"builtin_{r}.json").exists():
        built = load(folder / f"builtin_{r}.json")
        held = load(folder / f"heldout_{r}.json")
        llama = load(folder / f"llamacpp_{r}.json")
        cats = by_category(built)
        llama_cats = by_category(llama) if llama else {}
        where, trips = placement(built)
        row = {"round": r, "where": where, "trips": trips}
        for cat in ("copy", "novel"):
            c = cats[cat]
            row[f"plain_{cat}"] = c["plain_decode_tokens_per_second"]
            row[f"oracle_{cat}"] = c["oracle"]["decode_ratio_to_plain"]
            row[f"ngram_{cat}"] = c["ngram"]["decode_ratio_to_plain"]
            row[f"llama_{cat}"] = llama_cats.get(cat, {}).get("decode_tokens_per_second")
        row["oracle_acceptance"] = cats["copy"]["oracle"]["acceptance_rate"]
        row["ngram_acceptance"] = cats["copy"]["ngram"]["acceptance_rate"]
        row["heldout"] = by_category(held)["copy"]["ngram"]["decode_ratio_to_plain"] if held else None
        novel = [p["ngram"] for p in built["prompts"] if p["category"] == "novel"]
        row["novel_worst"] = min(n["decode_ratio_to_plain"] for n in novel)
        paired = [n["paired_decode_ratio_to_plain"] for n in novel
                  if "paired_decode_ratio_to_plain" in n]
        row["novel_worst_paired"] = min(paired) if paired else None
        row["verify_cost"] = built["step_cost_ratio"][-1] if built.get("step_cost_ratio") else None
        row["identical"] = built["identical_to_plain"] and (held is None or held["identical_to_plain"])
        rows.append(row)
        r += 1
    if not rows:
        sys.exit(f"mixkv: no builtin_1.json in {folder}")

    print("| round (placement, round trip ns) | llama.cpp plain copy / novel | mixkv plain copy / novel "
          "| oracle k 4 copy / novel | ngram copy / novel | held-out ngram | ngram copy x llama.cpp "
          "| worst novel ngram (medians; paired) | 5-row step |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        ngram_tps = row["plain_copy"] * row["ngram_copy"]
        vs_llama = ngram_tps / row["llama_copy"] if row["llama_copy"] else None
        trips = " / ".join(fmt(t, ".0f") for t in row["trips"])
        print(f"| {row['round']} ({row['where']}, {trips}) "
              f"| {fmt(row['llama_copy'], '.1f')} / {fmt(row['llama_novel'], '.1f')} "
              f"| {row['plain_copy']:.1f} / {row['plain_novel']:.1f} "
              f"| {row['oracle_copy']:.2f}x / {row['oracle_novel']:.2f}x "
              f"| {row['ngram_copy']:.2f}x / {row['ngram_novel']:.2f}x "
              f"| {fmt(row['heldout'], '.2f', 'x')} | {fmt(vs_llama, '.2f', 'x')} "
              f"| {row['novel_worst']:.3f}x; {fmt(row['novel_worst_paired'], '.3f', 'x')} "
              f"| {fmt(row['verify_cost'], '.2f')} |")
    print()
    for where in ("all", "near", "far"):
        chosen = [row for row in rows if where == "all" or row["where"] == where]
        if not chosen:
            continue
        medians = {k: median([row[k] for row in chosen])
                   for k in ("oracle_copy", "ngram_copy", "heldout", "novel_worst",
                             "novel_worst_paired")}
        plain_vs_llama = median([row["plain_copy"] / row["llama_copy"]
                                 for row in chosen if row["llama_copy"]])
        print(f"medians, {where} rounds ({len(chosen)}): oracle {fmt(medians['oracle_copy'])}x, "
              f"ngram copy {fmt(medians['ngram_copy'])}x, held out {fmt(medians['heldout'])}x, "
              f"worst novel {fmt(medians['novel_worst'], '.3f')}x "
              f"(paired {fmt(medians['novel_worst_paired'], '.3f', 'x')}), plain x llama.cpp "
              f"{fmt(plain_vs_llama)}")
    print("acceptance on the copy set: oracle "
          f"{min(r['oracle_acceptance'] for r in rows):.0%}-{max(r['oracle_acceptance'] for r in rows):.0%}, "
          f"ngram {min(r['ngram_acceptance'] for r in rows):.0%}-{max(r['ngram_acceptance'] for r in rows):.0%}; "
          f"greedy tokens identical to plain: {all(r['identical'] for r in rows)}")

    singles, batches, wheres = [], [], []
    i = 1
    while (folder / f"batch1_{i}.json").exists() and (folder / f"batch16_{i}.json").exists():
        one, sixteen = load(folder / f"batch1_{i}.json"), load(folder / f"batch16_{i}.json")
        singles.append(one["categories"][0]["plain_decode_tokens_per_second"])
        batches.append(sixteen["categories"][0]["plain_decode_tokens_per_second"])
        # A pair is near or far only when both of its runs were: batch 16 hands many more
        # lines between the threads than batch 1, so far pairs sit lower (docs/engine.md).
        where = {placement(one)[0], placement(sixteen)[0]}
        wheres.append(where.pop() if len(where) == 1 else "mixed")
        i += 1
    if singles:
        pairs = f"{len(singles)} pair{'s' if len(singles) > 1 else ''}"
        print(f"batch 16 against batch 1 ({pairs}, placements {', '.join(wheres)}): "
              f"{min(batches):.0f}-{max(batches):.0f} against {min(singles):.0f}-{max(singles):.0f} "
              f"tokens/s, {statistics.median(batches) / statistics.median(singles):.2f}x "
              "(ratio of medians)")
        ratios = [b / s for b, s in zip(batches, singles)]
        print("pair by pair: " + ", ".join(f"{r:.2f}x ({w})" for r, w in zip(ratios, wheres)) +
              f"; median pair {statistics.median(ratios):.2f}x")
        for kind in ("near", "far"):
            chosen = [k for k, w in enumerate(wheres) if w == kind]
            if chosen:
                ratio = (statistics.median(batches[k] for k in chosen) /
                         statistics.median(singles[k] for k in chosen))
                print(f"  {kind} pairs ({len(chosen)}): {ratio:.2f}x (ratio of medians)")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(pathlib.Path(sys.argv[1]))
