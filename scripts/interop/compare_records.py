#!/usr/bin/env python3
"""Compare two phasekv result directories record by record (results.jsonl of a sweep or an audit).

Records are joined on the item: (example_id, phase, padding, condition (a long-document cell),
needle), the fields that name an item in both. Prints how many items both have, how many agree on
correctness and on the prediction, the largest difference of the target's log-probability (where
both have one), for chat audits how many rendered prompts are identical (their token-id hash),
and the items where they disagree. Exit 1 when the two disagree on any correctness or prompt.
Usage: compare_records.py DIR_A DIR_B
"""
import json
import os
import sys

KEY = ("example_id", "phase", "padding", "condition", "needle")


def load(d):
    path = os.path.join(d, "results.jsonl")
    out = {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"{path}:{n}: not JSON ({e})")
            if r.get("error"):
                continue
            out[tuple(r.get(k) for k in KEY)] = r
    return path, out


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__.strip().splitlines()[-1])
    pa, a = load(sys.argv[1])
    pb, b = load(sys.argv[2])
    both = sorted(set(a) & set(b), key=lambda k: tuple(str(x) for x in k))
    if not both:
        sys.exit(f"no item in both {pa} ({len(a)} records) and {pb} ({len(b)})")
    same_correct = sum(a[k]["correct"] == b[k]["correct"] for k in both)
    same_pred = sum(a[k].get("prediction") == b[k].get("prediction") for k in both)
    diffs = [abs(a[k]["target_logprob"] - b[k]["target_logprob"]) for k in both
             if a[k].get("target_logprob") is not None and b[k].get("target_logprob") is not None]
    acc = lambda rs: sum(r["correct"] for r in rs) / len(rs)
    print(f"{sys.argv[1]} vs {sys.argv[2]}: {len(both)} items in both "
          f"({len(a)} and {len(b)} scored records)")
    print(f"  same correctness {same_correct}/{len(both)}, same prediction {same_pred}/{len(both)}; "
          f"accuracy {acc([a[k] for k in both]):.3f} vs {acc([b[k] for k in both]):.3f}")
    if diffs:
        print(f"  target log-probability: max |difference| {max(diffs):.2e} over {len(diffs)} items")
    else:
        print("  target log-probability: not in both (generation mode, or censored: the target "
              "outside the top alternatives)")
    # Chat records carry the hash of the rendered prompt's token ids: two servers that render the
    # same template must have made the same prompts.
    hashed = [k for k in both if a[k].get("prompt_ids_fnv1a64") and b[k].get("prompt_ids_fnv1a64")]
    same_prompt = sum(a[k]["prompt_ids_fnv1a64"] == b[k]["prompt_ids_fnv1a64"] for k in hashed)
    if hashed:
        print(f"  same rendered prompt (token-id hash) {same_prompt}/{len(hashed)}")
    for k in both:
        if a[k]["correct"] != b[k]["correct"]:
            print(f"  differs: {dict(zip(KEY, k))}: correct {a[k]['correct']} vs {b[k]['correct']}")
    return 0 if same_correct == len(both) and same_prompt == len(hashed) else 1


if __name__ == "__main__":
    sys.exit(main())
