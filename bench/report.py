#!/usr/bin/env python3
"""Merge Google Benchmark JSON (bench_group) and the Go peer's JSON into one
side-by-side markdown table (stdout) and a machine-readable results.json.

usage: report.py CPP_JSON [GO_JSON] [--out results.json]

Benchmark names are "<scenario>/impl:<impl>" plus Google Benchmark suffixes;
the median aggregate of the repetitions is used. Ratios are library (lib)
over baseline (c) (naive_cv; naive_cv_any for the churn scenario) and over Go.
A ratio < 1 means the library is cheaper/faster on that metric.
"""
import argparse
import json
import re
import sys

IMPLS = ["direct", "lib", "lib_tok", "naive_future", "naive_cv", "naive_cv_any", "go"]

# scenario prefix -> [(metric, label, digits)]
METRICS = [
    ("leader_", [("ns_per_call", "ns/call (wall)", 0), ("cpu_ns", "CPU ns/call", 0),
                 ("allocs_per_call", "allocs/call", 2)]),
    ("distinct_keys_mt", [("ns_per_call", "ns/call (aggregate)", 0), ("allocs_per_call", "allocs/call", 2)]),
    ("inflight_bytes", [("bytes_per_inflight", "bytes per in-flight call", 0)]),
    ("join/", [("attach_ns_per_join", "attach wall ns/join", 0), ("join_cpu_ns", "CPU ns/join (thread)", 0),
               ("proc_cpu_ns_per_join", "CPU ns/join (process)", 0), ("allocs_per_join", "allocs/join", 2)]),
    ("burst/", [("settle_to_last_us", "settle->last waiter µs", 1), ("settle_to_median_us", "settle->median waiter µs", 1),
                ("origin_calls_per_burst", "origin calls/burst", 2), ("allocs_per_call", "allocs/call", 3)]),
    ("burst_natural/", [("origin_calls_per_burst", "origin calls/burst", 2), ("coalescing_ratio", "flights/calls", 4)]),
    ("seed_", [("origin_calls", "origin calls", 1), ("p50_ms", "p50 ms", 1), ("p99_ms", "p99 ms", 1)]),
    ("churn_", [("ns_per_call", "wall ns per join+leave", 0), ("allocs_per_join_leave", "allocs per join+leave", 2)]),
]

TIME_SCALE = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}
GB_SUFFIX = re.compile(r"^(real_time|min_time:[\d.]+|iterations:\d+|repeats:\d+|process_time)$")


def parse_cpp(path):
    with open(path) as f:
        doc = json.load(f)
    out = {}  # (scenario, impl) -> metrics
    errors = []
    for b in doc.get("benchmarks", []):
        if b.get("error_occurred"):
            errors.append(f"{b.get('run_name', b['name'])}: {b.get('error_message')}")
            continue
        if b.get("run_type") == "aggregate" and b.get("aggregate_name") != "median":
            continue
        name = b.get("run_name", b["name"])
        parts = [p for p in name.split("/") if not GB_SUFFIX.match(p)]
        impl = next((p[5:] for p in parts if p.startswith("impl:")), None)
        if impl is None:
            continue
        scenario = "/".join(p for p in parts if not p.startswith("impl:"))
        m = {}
        for k, v in b.items():
            if isinstance(v, (int, float)) and k not in ("family_index", "per_family_instance_index",
                                                         "repetitions", "repetition_index", "threads",
                                                         "iterations", "real_time", "cpu_time"):
                m[k] = float(v)
        scale = TIME_SCALE.get(b.get("time_unit", "ns"), 1.0)
        m["real_ns"] = b["real_time"] * scale
        m["cpu_ns"] = b["cpu_time"] * scale
        if scenario.startswith("distinct_keys_mt") and m.get("items_per_second"):
            m["ns_per_call"] = 1e9 / m["items_per_second"]
        else:
            m["ns_per_call"] = m["real_ns"]
        out[(scenario, impl)] = m
    return doc.get("context", {}), out, errors


def parse_go(path):
    with open(path) as f:
        doc = json.load(f)
    out = {}
    errors = []
    for r in doc.get("results", []):
        if r["metrics"].get("error"):
            errors.append(f"go {r['name']}: origin calls per burst != 1 or wrong value")
        out[(r["name"], "go")] = r["metrics"]
    return {k: v for k, v in doc.items() if k != "results"}, out, errors


def fmt(v, digits):
    if v is None:
        return "—"
    if abs(v) >= 1e5 and digits == 0:
        return f"{v:,.0f}"
    return f"{v:.{digits}f}"


def ratio(a, b):
    if a is None or b is None or b == 0:
        return None
    return a / b


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cpp")
    ap.add_argument("go", nargs="?")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    ctx, data, errors = parse_cpp(args.cpp)
    go_ctx = {}
    if args.go:
        go_ctx, g, gerr = parse_go(args.go)
        data.update(g)
        errors += gerr

    scenarios = []
    for (s, _i) in data:
        if s not in scenarios:
            scenarios.append(s)

    def order(s):
        for idx, (prefix, _) in enumerate(METRICS):
            if s.startswith(prefix):
                nums = [int(x) for x in re.findall(r"\d+", s)]
                return (idx, s.split("/")[0], nums)
        return (99, s, [])

    scenarios.sort(key=order)
    present = [i for i in IMPLS if any(k[1] == i for k in data)]

    lines = []
    head = ["scenario", "metric"] + present + ["lib / (c)", "lib / go"]
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "|".join(["---"] * 2 + ["---:"] * (len(head) - 2)) + "|")
    rows = []
    for s in scenarios:
        metrics = next((ms for prefix, ms in METRICS if s.startswith(prefix)), None)
        if metrics is None:
            continue
        base_c = "naive_cv_any" if s.startswith("churn_") else "naive_cv"
        for key, label, digits in metrics:
            vals = {i: data.get((s, i), {}).get(key) for i in present}
            if all(v is None for v in vals.values()):
                continue
            lib = vals.get("lib")
            rc = ratio(lib, vals.get(base_c))
            rg = ratio(lib, vals.get("go"))
            cells = [s, label] + [fmt(vals[i], digits) for i in present]
            cells += [fmt(rc, 2) if rc is not None else "—", fmt(rg, 2) if rg is not None else "—"]
            lines.append("| " + " | ".join(cells) + " |")
            rows.append({"scenario": s, "metric": key, "label": label, "values": vals,
                         "lib_over_c": rc, "lib_over_go": rg})

    print("\n".join(lines))
    if errors:
        print("\n**Errors:**")
        for e in errors:
            print(f"- {e}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"context": ctx, "go_context": go_ctx, "errors": errors, "rows": rows,
                       "raw": [{"scenario": s, "impl": i, "metrics": m} for (s, i), m in sorted(data.items())]},
                      f, indent=1, sort_keys=True)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
