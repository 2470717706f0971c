// Go peer for bench/bench_group.cpp: the same scenarios on
// golang.org/x/sync/singleflight, printed as JSON (one object per scenario,
// metrics are the median of -reps repetitions).
//
// Build/run in GOPATH mode against Debian's golang-golang-x-sync-dev:
//   GO111MODULE=off GOPATH=/usr/share/gocode go run bench/peers/go/main.go
//
// Scenario names match the C++ ones so bench/report.py can put them side by side.
// Measurement notes:
//   * allocations come from runtime.MemStats.Mallocs (process-wide), taken
//     with the workers parked, so only the measured calls contribute.
//   * Go has no per-goroutine CPU clock: join cost is reported as wall time
//     per join and as process CPU (getrusage) per join.
//   * The gated hot-key burst needs to know when all N-1 followers have
//     joined; x/sync/singleflight counts them in the unexported call.dups,
//     read here (under the group's mutex) with reflect + unsafe. It is only
//     used inside fn, to hold the flight open until the burst has formed.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"reflect"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sync/singleflight"
)

type result struct {
	Name    string             `json:"name"`
	Impl    string             `json:"impl"`
	Metrics map[string]float64 `json:"metrics"`
}

var minTime = flag.Duration("min_time", 200*time.Millisecond, "minimum measuring time per scenario repetition")
var reps = flag.Int("reps", 3, "repetitions (median reported)")
var filter = flag.String("filter", "", "only scenarios whose name contains this")

func makeKey(tenant, user, thread int) string {
	return fmt.Sprintf("tenant-%03d|user-%06d|en-GB|v3|t%d", tenant, user, thread)
}

func makeKeys(n, thread int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = makeKey(i%97, i, thread)
	}
	return keys
}

func mallocs() uint64 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.Mallocs
}

func procCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// dupsReader reads call.dups for the flight on one key (-1: no flight),
// without allocating, so that polling it does not pollute allocation counts.
type dupsReader struct {
	mu   *sync.Mutex
	m    reflect.Value
	key  reflect.Value
	dups int
}

func newDupsReader(g *singleflight.Group, key string) *dupsReader {
	v := reflect.ValueOf(g).Elem()
	f, ok := reflect.TypeOf(g).Elem().Field(1).Type.Elem().Elem().FieldByName("dups")
	if !ok {
		panic("x/sync/singleflight: call.dups not found")
	}
	return &dupsReader{
		mu:   (*sync.Mutex)(unsafe.Pointer(v.Field(0).UnsafeAddr())),
		m:    v.Field(1),
		key:  reflect.ValueOf(key),
		dups: f.Index[0],
	}
}

func (d *dupsReader) get() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.m.IsNil() {
		return -1
	}
	c := d.m.MapIndex(d.key)
	if !c.IsValid() {
		return -1
	}
	return int(c.Elem().Field(d.dups).Int())
}

// crew: parked goroutines that run one job per round (no goroutine creation,
// and no allocation, inside a measured round).
type crew struct {
	start []chan struct{}
	done  sync.WaitGroup
	job   func(i int)
}

func newCrew(n int) *crew {
	c := &crew{start: make([]chan struct{}, n)}
	for i := range c.start {
		c.start[i] = make(chan struct{})
		go func(i int) {
			for range c.start[i] {
				c.job(i)
				c.done.Done()
			}
		}(i)
	}
	return c
}

func (c *crew) run(n int, job func(i int)) {
	c.begin(n, job)
	c.done.Wait()
}

func (c *crew) begin(n int, job func(i int)) {
	c.job = job
	c.done.Add(n)
	for i := 0; i < n; i++ {
		c.start[i] <- struct{}{}
	}
}

var theCrew = newCrew(1100)

func awaitCond(pred func() bool) bool {
	deadline := time.Now().Add(10 * time.Second)
	for !pred() {
		if time.Now().After(deadline) {
			return false
		}
		runtime.Gosched()
	}
	return true
}

// ---- scenarios ---------------------------------------------------------------

func leaderSameKey() map[string]float64 {
	var g singleflight.Group
	key := makeKey(7, 7, 0)
	var x uint64
	fn := func() (interface{}, error) { x++; return x, nil }
	g.Do(key, fn)
	n := 1000
	for {
		m0 := mallocs()
		c0 := procCPU()
		t0 := time.Now()
		for i := 0; i < n; i++ {
			g.Do(key, fn)
		}
		el := time.Since(t0)
		cpu := procCPU() - c0
		m1 := mallocs()
		if el >= *minTime {
			return map[string]float64{
				"cpu_ns":          float64(cpu.Nanoseconds()) / float64(n),
				"ns_per_call":     float64(el.Nanoseconds()) / float64(n),
				"allocs_per_call": float64(m1-m0) / float64(n),
			}
		}
		n *= 4
	}
}

func leaderDistinct() map[string]float64 {
	var g singleflight.Group
	keys := makeKeys(1024, 0)
	var x uint64
	fn := func() (interface{}, error) { x++; return x, nil }
	for _, k := range keys {
		g.Do(k, fn)
	}
	n := 1024
	for {
		m0 := mallocs()
		c0 := procCPU()
		t0 := time.Now()
		for i := 0; i < n; i++ {
			g.Do(keys[i&1023], fn)
		}
		el := time.Since(t0)
		cpu := procCPU() - c0
		m1 := mallocs()
		if el >= *minTime {
			return map[string]float64{
				"cpu_ns":          float64(cpu.Nanoseconds()) / float64(n),
				"ns_per_call":     float64(el.Nanoseconds()) / float64(n),
				"allocs_per_call": float64(m1-m0) / float64(n),
			}
		}
		n *= 4
	}
}

func distinctMT(threads int) map[string]float64 {
	var g singleflight.Group
	keys := make([][]string, threads)
	for t := range keys {
		keys[t] = makeKeys(1024, t)
	}
	var stop atomic.Bool
	var total atomic.Int64
	var wg sync.WaitGroup
	m0 := mallocs()
	t0 := time.Now()
	for t := 0; t < threads; t++ {
		wg.Add(1)
		go func(t int) {
			defer wg.Done()
			var x uint64
			fn := func() (interface{}, error) { x++; return x, nil }
			ks := keys[t]
			n := 0
			for !stop.Load() {
				for j := 0; j < 256; j++ {
					g.Do(ks[n&1023], fn)
					n++
				}
			}
			total.Add(int64(n))
		}(t)
	}
	time.Sleep(*minTime)
	stop.Store(true)
	wg.Wait()
	el := time.Since(t0)
	m1 := mallocs()
	calls := float64(total.Load())
	return map[string]float64{
		"ns_per_call":      float64(el.Nanoseconds()) / calls,
		"items_per_second": calls / el.Seconds(),
		"allocs_per_call":  float64(m1-m0) / calls,
	}
}

// join: a flight held open by fn blocked on a gate; n goroutines, parked at
// the line, are released together and join it. attach_ns_per_join is the
// wall time from the release until all n have joined, divided by n.
func join(n int) map[string]float64 {
	var g singleflight.Group
	key := makeKey(1, 1, 0)
	dr := newDupsReader(&g, key)
	rounds := 0
	var attach, wall, cpu time.Duration
	var allocs uint64
	var origin atomic.Int32
	var wrong atomic.Int32
	run := func(joiners int) (time.Duration, time.Duration, time.Duration, uint64) {
		gate := make(chan struct{})
		started := make(chan struct{})
		release := make(chan struct{})
		var arrived sync.WaitGroup
		arrived.Add(joiners)
		origin.Store(0)
		runtime.GC()
		m0 := mallocs()
		t0 := time.Now()
		theCrew.begin(joiners+1, func(i int) {
			if i == 0 {
				g.Do(key, func() (interface{}, error) {
					origin.Add(1)
					close(started)
					<-gate
					return 42, nil
				})
				return
			}
			<-started
			arrived.Done()
			<-release
			v, _, _ := g.Do(key, func() (interface{}, error) { origin.Add(1); return 7, nil })
			if v.(int) != 42 {
				wrong.Add(1)
			}
		})
		<-started
		arrived.Wait()
		c0 := procCPU()
		tr := time.Now()
		close(release)
		awaitCond(func() bool { return dr.get() == joiners })
		ta := time.Now()
		close(gate)
		theCrew.done.Wait()
		return ta.Sub(tr), time.Since(t0), procCPU() - c0, mallocs() - m0
	}
	// Allocation cost of a round with no joiners, subtracted below.
	_, _, _, base := run(0)
	_, _, _, base2 := run(0)
	if base2 < base {
		base = base2
	}
	for wall < *minTime/2 || rounds < 5 {
		at, w, c, a := run(n)
		attach += at
		wall += w
		cpu += c
		allocs += a
		rounds++
		if origin.Load() != 1 || wrong.Load() != 0 {
			return map[string]float64{"error": 1}
		}
	}
	joins := float64(rounds * n)
	return map[string]float64{
		"attach_ns_per_join":   float64(attach.Nanoseconds()) / joins,
		"round_ns_per_join":    float64(wall.Nanoseconds()) / joins,
		"proc_cpu_ns_per_join": float64(cpu.Nanoseconds()) / joins,
		"allocs_per_join":      (float64(allocs) - float64(base)*float64(rounds)) / joins,
	}
}

func burst(n, fnUS int, gated bool) map[string]float64 {
	var g singleflight.Group
	key := makeKey(2, 2, 0)
	dr := newDupsReader(&g, key)
	returned := make([]time.Time, n)
	var fnReturned time.Time
	var origin atomic.Int32
	var wrong atomic.Int32
	rounds := 0
	originTotal := 0
	var settleLast, settleMedian float64
	var elapsed time.Duration
	var allocs uint64
	for elapsed < *minTime/2 || rounds < 3 { // bursts: half the time, like the C++ MinTime(0.1)
		origin.Store(0)
		release := make(chan struct{})
		var arrived sync.WaitGroup
		arrived.Add(n)
		runtime.GC()
		m0 := mallocs()
		t0 := time.Now()
		theCrew.begin(n, func(i int) {
			arrived.Done()
			<-release
			v, _, _ := g.Do(key, func() (interface{}, error) {
				origin.Add(1)
				if gated {
					awaitCond(func() bool { return dr.get() >= n-1 })
				}
				if fnUS > 0 {
					time.Sleep(time.Duration(fnUS) * time.Microsecond)
				}
				fnReturned = time.Now()
				return 42, nil
			})
			returned[i] = time.Now()
			if v.(int) != 42 {
				wrong.Add(1)
			}
		})
		arrived.Wait() // the latch: everybody is at the line
		close(release)
		theCrew.done.Wait()
		elapsed += time.Since(t0)
		allocs += mallocs() - m0
		rounds++
		o := int(origin.Load())
		originTotal += o
		if wrong.Load() != 0 || (gated && o != 1) {
			return map[string]float64{"error": 1, "origin_calls_per_burst": float64(o)}
		}
		sort.Slice(returned, func(a, b int) bool { return returned[a].Before(returned[b]) })
		settleLast += float64(returned[n-1].Sub(fnReturned).Nanoseconds())
		settleMedian += float64(returned[n/2].Sub(fnReturned).Nanoseconds())
	}
	r := float64(rounds)
	res := map[string]float64{
		"origin_calls_per_burst": float64(originTotal) / r,
		"coalescing_ratio":       float64(originTotal) / (r * float64(n)),
		"allocs_per_call":        float64(allocs) / (r * float64(n)),
		"round_us":               float64(elapsed.Nanoseconds()) / r / 1000,
	}
	if gated { // with several flights per burst "the" settle time is undefined
		res["settle_to_last_us"] = settleLast / r / 1000
		res["settle_to_median_us"] = settleMedian / r / 1000
	}
	return res
}

func seed() map[string]float64 {
	const callers = 100
	key := makeKey(3, 3, 0)
	var lat []float64
	origin := 0
	for round := 0; round < 3; round++ {
		var g singleflight.Group
		var o atomic.Int32
		rl := make([]float64, callers)
		t0 := time.Now().Add(5 * time.Millisecond)
		theCrew.run(callers, func(i int) {
			time.Sleep(time.Until(t0.Add(time.Duration(i) * 400 * time.Microsecond)))
			a := time.Now()
			g.Do(key, func() (interface{}, error) {
				o.Add(1)
				time.Sleep(200 * time.Millisecond)
				return 1, nil
			})
			rl[i] = float64(time.Since(a).Nanoseconds())
		})
		lat = append(lat, rl...)
		origin += int(o.Load())
	}
	sort.Float64s(lat)
	pct := func(q float64) float64 {
		i := int(q * float64(len(lat)))
		if i >= len(lat) {
			i = len(lat) - 1
		}
		return lat[i] / 1e6
	}
	return map[string]float64{
		"origin_calls":     float64(origin) / 3,
		"p50_ms":           pct(0.50),
		"p99_ms":           pct(0.99),
		"max_ms":           lat[len(lat)-1] / 1e6,
		"coalescing_ratio": float64(origin) / float64(3*callers),
	}
}

// ---- driver ------------------------------------------------------------------

func median(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	return s[len(s)/2]
}

func main() {
	flag.Parse()
	type scenario struct {
		name string
		reps int
		fn   func() map[string]float64
	}
	var scs []scenario
	add := func(name string, r int, fn func() map[string]float64) {
		scs = append(scs, scenario{name, r, fn})
	}
	add("leader_same_key_str", *reps, leaderSameKey)
	add("leader_distinct_1024", *reps, leaderDistinct)
	for _, t := range []int{1, 2, 4, 8} {
		t := t
		add(fmt.Sprintf("distinct_keys_mt/threads:%d", t), *reps, func() map[string]float64 { return distinctMT(t) })
	}
	for _, n := range []int{16, 128} {
		n := n
		add(fmt.Sprintf("join/N:%d", n), *reps, func() map[string]float64 { return join(n) })
	}
	for _, n := range []int{8, 64, 1024} {
		for _, us := range []int{0, 100, 1000} {
			n, us := n, us
			add(fmt.Sprintf("burst/N:%d/fn_us:%d", n, us), *reps, func() map[string]float64 { return burst(n, us, true) })
		}
	}
	for _, n := range []int{64, 1024} {
		for _, us := range []int{100, 1000} {
			n, us := n, us
			add(fmt.Sprintf("burst_natural/N:%d/fn_us:%d", n, us), *reps, func() map[string]float64 { return burst(n, us, false) })
		}
	}
	add("seed_100x40ms_origin200ms", 1, seed) // 3 rounds inside, like ->Iterations(3)

	var out []result
	for _, sc := range scs {
		if *filter != "" && !contains(sc.name, *filter) {
			continue
		}
		runs := map[string][]float64{}
		failed := false
		for r := 0; r < sc.reps; r++ {
			m := sc.fn()
			if m["error"] != 0 {
				failed = true
			}
			for k, v := range m {
				runs[k] = append(runs[k], v)
			}
		}
		med := map[string]float64{}
		for k, v := range runs {
			med[k] = median(v)
		}
		if failed {
			med["error"] = 1
			fmt.Fprintf(os.Stderr, "ERROR: %s: origin calls per burst != 1 or wrong value\n", sc.name)
		}
		fmt.Fprintf(os.Stderr, "%-40s %v\n", sc.name, med)
		out = append(out, result{Name: sc.name, Impl: "go", Metrics: med})
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", " ")
	if err := enc.Encode(map[string]interface{}{
		"go_version": runtime.Version(),
		"gomaxprocs": runtime.GOMAXPROCS(0),
		"results":    out,
	}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func contains(s, sub string) bool {
	return len(sub) == 0 || (len(s) >= len(sub) && indexOf(s, sub) >= 0)
}

func indexOf(s, sub string) int {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return i
		}
	}
	return -1
}
