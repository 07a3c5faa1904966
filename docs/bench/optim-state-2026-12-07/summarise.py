"""Block means of SFT loss curves against a reference curve.

Usage: python3 summarise.py NAME=losses.jsonl [NAME=losses.jsonl ...]
The first curve is the reference. Each file is what `trainer sft --losses F` writes: one JSON
object per optimiser step with its `loss`. Prints a markdown table of 25-step block means (each
other curve with its difference from the reference) and each curve's mean over all steps and
over the last 50.
"""
import json
import statistics as st
import sys


def main(args):
    curves = {}
    for arg in args:
        name, path = arg.split("=", 1)
        with open(path) as f:
            curves[name] = [json.loads(line)["loss"] for line in f if line.strip()]
    if not curves:
        sys.exit(__doc__)
    n = min(len(c) for c in curves.values())
    ref_name = next(iter(curves))
    ref = curves[ref_name]
    print("| steps | " + " | ".join(curves) + " |")
    print("|---|" + "---:|" * len(curves))
    for a in range(0, n, 25):
        b = min(a + 25, n)
        r = st.mean(ref[a:b])
        cells = [f"{a + 1}-{b}"]
        for name, c in curves.items():
            m = st.mean(c[a:b])
            cells.append(f"{m:.4f}" if name == ref_name else f"{m:.4f} ({m - r:+.4f})")
        print("| " + " | ".join(cells) + " |")
    print()
    print("| curve | mean, all steps | difference from " + ref_name + " | mean, last 50 steps |")
    print("|---|---:|---:|---:|")
    for name, c in curves.items():
        d = st.mean(x - y for x, y in zip(c[:n], ref[:n]))
        print(f"| {name} | {st.mean(c[:n]):.4f} | {d:+.4f} | {st.mean(c[n - 50:n]):.4f} |")


if __name__ == "__main__":
    main(sys.argv[1:])
