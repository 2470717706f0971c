#!/usr/bin/env python3
"""bench/include_cost.py: what parsing a library header costs a TU, per standard header.

Reads a clang -ftime-trace JSON and sums the exclusive time of its "Source" events (the time
spent in each file, less the files it includes) by the standard header the library included
first on the way to each file, leaving out the files a baseline program parses anyway; the
library's own headers are one line. Run from the repository's root:

  printf '#include <singleflight/cache.hpp>\\nint main() {}\\n' > /tmp/inc.cpp
  clang++ -std=c++20 -O2 -DSINGLEFLIGHT_SEPARATE_COMPILATION -I include -ftime-trace \\
      -ftime-trace-granularity=0 -c /tmp/inc.cpp -o /tmp/inc.o
  bench/include_cost.py /tmp/inc.json bench/compile_time/naive_cache.cpp

The baseline's files come from `clang++ -std=c++20 -H -fsyntax-only BASELINE`. A file's
exclusive time includes the templates instantiated while it is parsed. One run: the figures
move by a few milliseconds from run to run.
"""
import collections
import json
import os
import subprocess
import sys


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: bench/include_cost.py TRACE.json BASELINE.cpp")
    trace, baseline = sys.argv[1], sys.argv[2]
    out = subprocess.run(["clang++", "-std=c++20", "-H", "-fsyntax-only", baseline],
                         capture_output=True, text=True, check=True).stderr
    seen = {os.path.realpath(line.split(" ", 1)[1].strip())
            for line in out.splitlines() if line.startswith(".")}

    events = [e for e in json.load(open(trace))["traceEvents"]
              if e.get("name") == "Source" and e.get("ph") == "X"]
    events.sort(key=lambda e: (e["ts"], -e["dur"]))

    def ours(path):
        return "/singleflight/" in path

    stack, nodes = [], []
    for e in events:
        while stack and stack[-1]["end"] <= e["ts"]:
            stack.pop()
        path = e["args"]["detail"]
        node = {"path": path, "end": e["ts"] + e["dur"], "excl": e["dur"]}
        if stack:
            stack[-1]["excl"] -= e["dur"]
        chain = [n["path"] for n in stack] + [path]
        if ours(path):
            node["by"] = "the library's own headers"
        else:
            # the outermost standard header under the innermost library header
            node["by"] = "(included by the TU itself)"
            for i, p in enumerate(chain):
                if not ours(p) and i > 0 and ours(chain[i - 1]):
                    node["by"] = "%s <- %s" % (p.split("/include/c++/")[-1].split("/", 1)[-1],
                                               os.path.basename(chain[i - 1]))
        stack.append(node)
        nodes.append(node)

    cost = collections.Counter()
    for n in nodes:
        if os.path.realpath(n["path"]) not in seen:
            cost[n["by"]] += n["excl"]
    total = sum(cost.values())
    print("parsed beyond %s: %.1f ms" % (baseline, total / 1000))
    for by, us in cost.most_common():
        if us >= 500:
            print("%8.1f ms  %s" % (us / 1000, by))


if __name__ == "__main__":
    main()
