# bench/compile_time_lib.sh: what bench/compile_time.sh and bench/compile_time_ab.sh share;
# sourced by both, after they set
#   tmp     a scratch directory (the records go there)
#   extra   an array of flags for every compile (may be empty)
#   inc     the include/ directory to compile against (compile_time_ab.sh switches it)
# and provides
#   median                          the median of the numbers on stdin
#   once TAG CXX FILE [FLAG...]     compiles FILE once (-std=c++20 -O2 -c), appends wall seconds,
#                                   CPU seconds (user + sys) and peak RSS (KB, 0 without
#                                   /usr/bin/time) to $tmp/TAG.w, .c, .r
#   medians TAG                     "wall cpu rss_mb", the medians of what once() recorded
# shellcheck shell=bash

timebin=""
if [ -x /usr/bin/time ]; then timebin=/usr/bin/time; fi

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else printf "%.3f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

once() {
  local tag=$1 cxx=$2 file=$3 wall user sys rss
  shift 3
  if [ -n "$timebin" ]; then
    "$timebin" -f '%e %U %S %M' -o "$tmp/t" \
      "$cxx" -std=c++20 -O2 "${extra[@]}" "$@" -I "$inc" -c "$file" -o "$tmp/o.o"
    read -r wall user sys rss <"$tmp/t"
  else
    local t0 t1
    t0=$(date +%s.%N)
    "$cxx" -std=c++20 -O2 "${extra[@]}" "$@" -I "$inc" -c "$file" -o "$tmp/o.o"
    t1=$(date +%s.%N)
    wall=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')
    user=$wall sys=0 rss=0
  fi
  echo "$wall" >>"$tmp/$tag.w"
  awk -v u="$user" -v s="$sys" 'BEGIN { printf "%.2f\n", u + s }' >>"$tmp/$tag.c"
  echo "$rss" >>"$tmp/$tag.r"
}

medians() {
  echo "$(median <"$tmp/$1.w") $(median <"$tmp/$1.c") $(median <"$tmp/$1.r" | awk '{ printf "%.0f", $1 / 1024 }')"
}
