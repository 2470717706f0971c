#!/usr/bin/env python3
"""Merge Google Benchmark JSON (bench_group) and the Go peer's JSON into one
side-by-side markdown table (stdout) and a machine-readable results.json.

usage: report.py CPP_JSON [GO_JSON] [--async ASYNC_JSON] [--cache CACHE_JSON] [--out results.json]

Benchmark names are "<scenario>/impl:<impl>" plus Google Benchmark suffixes;
the median aggregate of the repetitions is used. Ratios are library (lib)
over baseline (c) (naive_cv; naive_cv_any for the churn scenario) and over Go.
A ratio < 1 means the library is cheaper/faster on that metric.

--async adds the "Async" block from bench_async's JSON (callback and
coroutine waiters vs blocking do_ callers and vs hand-rolled floors), with
ratios async_do / do_, co_do / do_, co_do / handles, async_do / functions.

--cache adds the "Cache" block from bench_cache's JSON: one row per goal of
issue 10 (stampede at expiry, origin failing, jitter spread, hit path, hit
ratio), each with its baselines and the ratio or count the goal is about.
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

# bench_async: impl columns, ratio columns (numerator, denominator), metrics.
ASYNC_IMPLS = ["do_", "async_do", "co_do", "handles", "functions"]
ASYNC_RATIOS = [("async_do", "do_"), ("co_do", "do_"), ("co_do", "handles"), ("async_do", "functions")]
ASYNC_METRICS = [
    ("async_waiters/", [("attach_ns_per_join", "join phase: wall ns/join", 0),
                        ("attach_cpu_ns_per_join", "join phase: CPU ns/join", 0),
                        ("allocs_per_join", "allocs/join", 2),
                        ("bytes_per_join", "heap bytes/join (frames excluded)", 0),
                        ("frame_bytes", "coroutine frame bytes", 0),
                        ("awaiter_bytes", "sizeof co_do awaiter (in frame)", 0),
                        ("settle_to_last_us", "settle->last resume µs (wall)", 1),
                        ("ns_per_resume", "settle->last / N, ns (wall)", 0),
                        ("cpu_ns_per_resume", "settle CPU / N, ns", 0),
                        ("resolver_us", "set_value() busy µs (wall)", 1),
                        ("settle_allocs_per_waiter", "settle allocs/waiter", 2),
                        ("cpu_ns_per_waiter", "CPU ns/waiter, whole life", 0)]),
    ("async_bytes/", [("allocs_per_join", "allocs/join", 2),
                      ("bytes_per_join", "heap bytes/join (frames excluded)", 0),
                      ("frame_bytes", "coroutine frame bytes", 0)]),
    ("async_leader_", [("ns_per_call", "ns/call (wall)", 0), ("cpu_ns", "CPU ns/call", 0),
                       ("allocs_per_call", "allocs/call", 2),
                       ("alloc_bytes_per_call", "heap bytes/call", 0)]),
]

# try_do against do_ + catch (bench_group "nothrow/case:<c>"): ns per call each, and the ratio.
NOTHROW_IMPLS = ["lib_throw", "lib_try"]

TIME_SCALE = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}
GB_SUFFIX = re.compile(r"^(real_time|min_time:[\d.]+|iterations:\d+|repeats:\d+|process_time)$")


def parse_cpp(path):
    with open(path) as f:
        text = f.read()
    doc = json.loads(text) if text.strip() else {}  # empty: FILTER matched nothing
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
    for r in doc.get("results") or []:  # null when FILTER matched no Go scenario
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


def async_block(data):
    """The "Async" table (markdown lines) and its rows for results.json."""
    scenarios = []  # in registration order
    for (sc, _i) in data:
        if sc not in scenarios:
            scenarios.append(sc)

    seen = {sc: n for n, sc in enumerate(scenarios)}

    def order(sc):
        for idx, (prefix, _) in enumerate(ASYNC_METRICS):
            if sc.startswith(prefix):
                return (idx, seen[sc])
        return (99, seen[sc])

    scenarios.sort(key=order)
    present = [i for i in ASYNC_IMPLS if any(k[1] == i for k in data)]
    ratios = [(a, b) for a, b in ASYNC_RATIOS if a in present and b in present]
    head = ["scenario", "metric"] + present + [f"{a} / {b}" for a, b in ratios]
    lines = ["| " + " | ".join(head) + " |",
             "|" + "|".join(["---"] * 2 + ["---:"] * (len(head) - 2)) + "|"]
    rows = []
    for sc in scenarios:
        metrics = next((ms for prefix, ms in ASYNC_METRICS if sc.startswith(prefix)), None)
        if metrics is None:
            continue
        for key, label, digits in metrics:
            vals = {i: data.get((sc, i), {}).get(key) for i in present}
            if all(v is None for v in vals.values()):
                continue
            # No ratio over a denominator that shows as 0 (e.g. 0.00006 allocs/call).
            rs = {f"{a}/{b}": (ratio(vals.get(a), vals.get(b))
                               if vals.get(b) is not None and round(vals[b], digits) != 0 else None)
                  for a, b in ratios}
            cells = [sc, label] + [fmt(vals[i], digits) for i in present]
            cells += [fmt(rs[f"{a}/{b}"], 2) for a, b in ratios]
            lines.append("| " + " | ".join(cells) + " |")
            rows.append({"scenario": sc, "metric": key, "label": label, "values": vals, "ratios": rs})
    return lines, rows


def cache_block(data):
    """The "Cache" table (markdown lines) and its rows for results.json."""
    def get(sc, impl, key):
        return data.get((sc, impl), {}).get(key)

    def agg_ns(sc, impl):
        ips = get(sc, impl, "items_per_second")
        return 1e9 / ips if ips else None

    lines = ["| goal | metric | lib | baselines | ratio / count |", "|---|---|---:|---|---:|"]
    rows = []

    def add(goal, metric, lib, base, verdict):
        lines.append(f"| {goal} | {metric} | {lib} | {base} | {verdict} |")
        rows.append({"goal": goal, "metric": metric, "lib": lib, "baselines": base, "verdict": verdict})

    for t in (1, 8, 64):
        sc = f"cache_stampede/threads:{t}"
        vals = {i: (get(sc, i, "origin_calls_per_expiry"), get(sc, i, "waited_per_expiry"))
                for i in ("lib_swr", "lib_xfetch", "lib_both", "naive", "group_only")}
        if all(v[0] is None for v in vals.values()):
            continue
        base = "; ".join(f"{i} {fmt(vals[i][0], 2)} / {fmt(vals[i][1], 1)}" for i in ("naive", "group_only"))
        for i in ("lib_swr", "lib_xfetch", "lib_both"):
            c, w = vals[i]
            add(f"stampede at expiry, {t} readers ({i[4:]})", "origin calls / waiting readers per expiry",
                f"{fmt(c, 2)} / {fmt(w, 1)}", base, f"{fmt(c, 2)} calls, {fmt(w, 1)} waits")
    sc = "cache_failing"
    if (sc, "lib") in data:
        lib = data[(sc, "lib")]
        nv = data.get((sc, "naive"), {})
        add("origin failing 10 s (error_ttl 1 s, stale_if_error)", "origin calls per key (max) / errors surfaced",
            f"{fmt(lib.get('origin_calls_per_key_max'), 0)} / {fmt(lib.get('errors_surfaced'), 0)}",
            f"naive {fmt(nv.get('origin_calls_per_key_max'), 0)} / {fmt(nv.get('errors_surfaced'), 0)}",
            f"{fmt(lib.get('origin_calls_per_key_max'), 0)} calls, {fmt(lib.get('errors_surfaced'), 0)} errors")
    sc = "cache_jitter"
    if (sc, "lib") in data:
        lib = data[(sc, "lib")]
        nj = data.get((sc, "no_jitter"), {})
        add("1,000 keys written at once, jitter 0.1", "largest 1%-of-ttl window / outside [0.9, 1.1] ttl (%)",
            f"{fmt(lib.get('max_window_pct'), 1)} / {fmt(lib.get('outside_pct'), 1)}",
            f"no jitter {fmt(nj.get('max_window_pct'), 1)} / {fmt(nj.get('outside_pct'), 1)}",
            f"{fmt(lib.get('max_window_pct'), 1)}% max")
    for v in ("u64", "str100"):
        sc1 = f"cache_hit/value:{v}/threads:1"
        sc2 = f"cache_hit/value:{v}/threads:2"
        lib1, rw1, rwt1 = agg_ns(sc1, "lib"), agg_ns(sc1, "shared_mutex"), agg_ns(sc1, "shared_mutex_ttl")
        free1 = agg_ns(sc1, "lib_free_clock")
        lib2, rw2, free2 = agg_ns(sc2, "lib"), agg_ns(sc2, "shared_mutex"), agg_ns(sc2, "lib_free_clock")
        if lib1 is None:
            continue
        add(f"hit path, 1 thread, T = {v}", "ns/call",
            fmt(lib1, 1), f"shared_mutex {fmt(rw1, 1)}; + steady_clock expiry check {fmt(rwt1, 1)}",
            f"{fmt(ratio(lib1, rw1), 2)}x shared_mutex, {fmt(ratio(lib1, rwt1), 2)}x with expiry check")
        coarse1, coarse2 = agg_ns(sc1, "lib_coarse_clock"), agg_ns(sc2, "lib_coarse_clock")
        add(f"hit path on coarse_clock, 1 thread, T = {v}", "ns/call",
            fmt(coarse1, 1), f"shared_mutex {fmt(rw1, 1)}", f"{fmt(ratio(coarse1, rw1), 2)}x shared_mutex")
        add(f"hit path without any clock read, 1 thread, T = {v}", "ns/call",
            fmt(free1, 1), f"shared_mutex {fmt(rw1, 1)}", f"{fmt(ratio(free1, rw1), 2)}x shared_mutex")
        add(f"hit path, 2 threads, distinct keys, T = {v}", "ns/call (aggregate)",
            fmt(lib2, 1), f"shared_mutex {fmt(rw2, 1)}; lib without clock {fmt(free2, 1)}",
            f"{fmt(ratio(lib1, lib2), 2)}x one thread's throughput (coarse_clock "
            f"{fmt(ratio(coarse1, coarse2), 2)}x, no clock {fmt(ratio(free1, free2), 2)}x; "
            f"shared_mutex {fmt(ratio(rw1, rw2), 2)}x)")
        # CPU per call per thread: what 2 threads cost each other (line transfers, waits),
        # independent of whether the machine had two idle cores for the wall-time row.
        cpu = {(i, t): get(f"cache_hit/value:{v}/threads:{t}", i, "cpu_ns") for i in ("lib", "shared_mutex")
               for t in (1, 2)}
        add(f"hit path, CPU per call and thread, 2 threads vs 1, T = {v}", "CPU ns/call",
            f"{fmt(cpu[('lib', 1)], 1)} -> {fmt(cpu[('lib', 2)], 1)}",
            f"shared_mutex {fmt(cpu[('shared_mutex', 1)], 1)} -> {fmt(cpu[('shared_mutex', 2)], 1)}",
            f"lib {fmt(ratio(cpu[('lib', 2)], cpu[('lib', 1)]), 2)}x, shared_mutex "
            f"{fmt(ratio(cpu[('shared_mutex', 2)], cpu[('shared_mutex', 1)]), 2)}x")
    sc = "cache_hit_ratio"
    if (sc, "lib") in data:
        lib = data[(sc, "lib")].get("hit_ratio_pct")
        lr = data.get((sc, "lru"), {}).get("hit_ratio_pct")
        add("hit ratio, Zipf 0.9 + one-hit scans, capacity 1%", "hit ratio (%)", fmt(lib, 1),
            f"LRU {fmt(lr, 1)}", f"+{fmt(lib - lr, 1)} points" if lib is not None and lr is not None else "—")
    return lines, rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cpp")
    ap.add_argument("go", nargs="?")
    ap.add_argument("--async", dest="async_json", default=None)
    ap.add_argument("--cache", dest="cache_json", default=None)
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
    nothrow_rows = []
    nothrow = sorted({s for (s, i) in data if s.startswith("nothrow/")})
    if nothrow:
        print("\n## No-throw calls (try_do against do_ + catch)\n")
        print("| case | do_ + catch ns/call | try_do ns/call | try_do / do_ | allocs/call (do_, try_do) |")
        print("|---|---:|---:|---:|---:|")
        for s in nothrow:
            t = data.get((s, "lib_throw"), {})
            y = data.get((s, "lib_try"), {})
            r = ratio(y.get("ns_per_call"), t.get("ns_per_call"))
            print(f"| {s.split(':', 1)[1]} | {fmt(t.get('ns_per_call'), 0)} | {fmt(y.get('ns_per_call'), 0)} | "
                  f"{fmt(r, 3) if r is not None else '—'} | {fmt(t.get('allocs_per_call'), 2)}, "
                  f"{fmt(y.get('allocs_per_call'), 2)} |")
            nothrow_rows.append({"scenario": s, "throw_ns": t.get("ns_per_call"), "try_ns": y.get("ns_per_call"),
                                 "try_over_throw": r})
    async_ctx, async_rows, async_data = {}, [], {}
    if args.async_json:
        async_ctx, async_data, aerr = parse_cpp(args.async_json)
        errors += aerr
        alines, async_rows = async_block(async_data)
        print("\n## Async (bench_async: callback and coroutine waiters; "
              "handles / functions = hand-rolled floors)\n")
        print("\n".join(alines))
    cache_ctx, cache_rows, cache_data = {}, [], {}
    if args.cache_json:
        cache_ctx, cache_data, cerr = parse_cpp(args.cache_json)
        errors += cerr
        clines, cache_rows = cache_block(cache_data)
        print("\n## Cache (bench_cache: one row per goal of issue 10, baselines in the same binary)\n")
        print("\n".join(clines))
    if errors:
        print("\n**Errors:**")
        for e in errors:
            print(f"- {e}")
    if args.out:
        doc = {"context": ctx, "go_context": go_ctx, "errors": errors, "rows": rows,
               "nothrow_rows": nothrow_rows,
               "raw": [{"scenario": s, "impl": i, "metrics": m} for (s, i), m in sorted(data.items())]}
        if args.async_json:
            doc["async_context"] = async_ctx
            doc["async_rows"] = async_rows
            doc["async_raw"] = [{"scenario": s, "impl": i, "metrics": m}
                                for (s, i), m in sorted(async_data.items())]
        if args.cache_json:
            doc["cache_context"] = cache_ctx
            doc["cache_rows"] = cache_rows
            doc["cache_raw"] = [{"scenario": s, "impl": i, "metrics": m}
                                for (s, i), m in sorted(cache_data.items())]
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1, sort_keys=True)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
