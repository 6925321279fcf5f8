package main

import (
	"encoding/json"
	"fmt"
	"html"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

type report struct {
	Meta    Meta     `json:"meta"`
	Results []Result `json:"results"`
}

// Library names as they appear in the report, in report order. ourName is
// the Redis Locker of this repository.
const (
	ourName          = "coordinator (ours)"
	ourPerWorkerName = "coordinator (ours; Locker per worker)"
	redissonName     = "redisson"
)

var reportOrder = []string{ourName, ourPerWorkerName, redissonName, redissonName + " (polling)", "redsync (default)", "redsync (1 ms retry)", "bsm/redislock", "raw floor", "round-trip limit"}

func (r Result) brief() string {
	switch {
	case r.Error != "":
		return "error: " + r.Error
	case r.Workload == wHold:
		return fmt.Sprintf("cpu=%.2fs cmds/s=%.0f scripts/s=%.0f rss=%.0fMiB goroutines=%d threads=%d lost=%d", r.CPUSeconds, r.RedisCmdsPS, r.RedisScriptsPS, mib(r.RSSBytes), r.Goroutines, r.Threads, r.LostDuring)
	case r.Workload == wLost:
		return fmt.Sprintf("detected %d/%d p50=%.0fms max=%.0fms (%s)", r.Detected, r.Trials, r.DetectP50, r.DetectMax, r.Mechanism)
	case r.HandoffP50us > 0 || r.Workload == wContended4 || r.Workload == wContended32:
		return fmt.Sprintf("acq/s=%.0f handoff p50=%.0fus p99=%.0fus fairness=%d/%d self=%.0f%% failures=%d overlaps=%d", r.OpsPerS, r.HandoffP50us, r.HandoffP99us, r.MaxPerWorker, r.MinPerWorker, 100*r.SelfReacquire, r.Failures, r.Overlaps)
	case r.Workload == wDistinct:
		return fmt.Sprintf("pairs/s=%.0f failures=%d", r.OpsPerS, r.Failures)
	default:
		return fmt.Sprintf("pairs/s=%.0f p50=%.0fus p99=%.0fus failures=%d", r.OpsPerS, r.P50us, r.P99us, r.Failures)
	}
}

// decade labels a power of ten of microseconds.
func decade(d float64) string {
	v := math.Pow(10, d)
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%.0f s", v/1e6)
	case v >= 1e3:
		return fmt.Sprintf("%.0f ms", v/1e3)
	default:
		return fmt.Sprintf("%.0f µs", v)
	}
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

func (rep *report) sort() {
	rank := func(name string) int {
		if i := slices.Index(reportOrder, name); i >= 0 {
			return i
		}
		return len(reportOrder)
	}
	slices.SortStableFunc(rep.Results, func(a, b Result) int {
		if c := strings.Compare(a.Workload, b.Workload); c != 0 {
			return c
		}
		return rank(a.Library) - rank(b.Library)
	})
}

func (rep *report) find(lib, workload string) *Result {
	for i := range rep.Results {
		if rep.Results[i].Library == lib && rep.Results[i].Workload == workload && rep.Results[i].Error == "" {
			return &rep.Results[i]
		}
	}
	return nil
}

func (rep *report) write(dir string) error {
	rep.sort()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "peers.json"), append(b, '\n'), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "peers.md"), []byte(rep.markdown()), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "handoff.svg"), []byte(rep.svg()), 0o644)
}

func (rep *report) rows(workload string) []Result {
	var out []Result
	for _, r := range rep.Results {
		if r.Workload == workload {
			out = append(out, r)
		}
	}
	return out
}

func f0(v float64) string {
	if v == 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f", v)
}

func us(v float64) string {
	switch {
	case v == 0:
		return "-"
	case v >= 10000:
		return fmt.Sprintf("%.0f ms", v/1000)
	case v >= 1000:
		return fmt.Sprintf("%.2f ms", v/1000)
	default:
		return fmt.Sprintf("%.0f µs", v)
	}
}

func spread(r Result) string {
	if r.Rounds < 2 {
		return "-"
	}
	return fmt.Sprintf("%.0f-%.0f", r.OpsPerSMin, r.OpsPerSMax)
}

func errCell(r Result) string {
	if r.Error == "" {
		return ""
	}
	return " (error: " + strings.ReplaceAll(r.Error, "|", "/") + ")"
}

func (rep *report) markdown() string {
	var b strings.Builder
	m := rep.Meta
	w := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	w("# Peer lock benchmarks\n\n")
	w("Measured %s to %s on %s (%d cores, %.1f GiB, Linux %s); load average %s at start, %s at end.",
		m.Started, m.Finished, cmpOr(m.CPU, "unknown CPU"), m.Cores, m.MemoryGiB, m.Kernel, m.LoadStart, m.LoadEnd)
	if m.LoadNote != "" {
		w(" %s", m.LoadNote)
	}
	w("\n\nCommand: `%s`\n\n", cmpOr(m.Command, "peerbench"))
	keys := make([]string, 0, len(m.Versions))
	for k := range m.Versions {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	w("Versions:")
	for i, k := range keys {
		sep := ","
		if i == 0 {
			sep = ""
		}
		w("%s %s %s", sep, k, m.Versions[k])
	}
	w(".\n\nParameters:")
	pk := make([]string, 0, len(m.Params))
	for k := range m.Params {
		pk = append(pk, k)
	}
	slices.Sort(pk)
	for i, k := range pk {
		sep := ","
		if i == 0 {
			sep = ""
		}
		w("%s %s=%s", sep, k, m.Params[k])
	}
	w(".\n\n")

	floor := rep.find("raw floor", wUncontended)
	w("## (a) Uncontended acquire+release, 1 worker\n\n")
	w("Each row of (a), (b) and (c) is the library's median round by throughput; the range is the slowest and fastest round.\n\n")
	w("| library | pairs/s | range over rounds | x raw floor | p50 | p99 | failures |\n|---|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range rep.rows(wUncontended) {
		ratio := "-"
		if floor != nil && floor.OpsPerS > 0 {
			ratio = fmt.Sprintf("%.2f", r.OpsPerS/floor.OpsPerS)
		}
		w("| %s%s | %s | %s | %s | %s | %s | %d |\n", r.Library, errCell(r), f0(r.OpsPerS), spread(r), ratio, us(r.P50us), us(r.P99us), r.Failures)
	}
	floorB := rep.find("raw floor", wDistinct)
	w("\n## (b) 16 workers on distinct keys\n\n")
	w("| library | pairs/s | range over rounds | x raw floor | failures |\n|---|---:|---:|---:|---:|\n")
	for _, r := range rep.rows(wDistinct) {
		ratio := "-"
		if floorB != nil && floorB.OpsPerS > 0 {
			ratio = fmt.Sprintf("%.2f", r.OpsPerS/floorB.OpsPerS)
		}
		w("| %s%s | %s | %s | %s | %d |\n", r.Library, errCell(r), f0(r.OpsPerS), spread(r), ratio, r.Failures)
	}
	for _, wl := range []string{wContended4, wContended32} {
		n := 4
		if wl == wContended32 {
			n = 32
		}
		w("\n## (c) %d workers on one key, each holding %s\n\n", n, m.Params["hold_work"])
		w("| library | acquisitions/s | range over rounds | handoff p50 | handoff p99 | fairness max/min per worker | same worker again | failed acquires | overlaps |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, r := range rep.rows(wl) {
			fair := fmt.Sprintf("%d/%d", r.MaxPerWorker, r.MinPerWorker)
			if r.MinPerWorker > 0 {
				fair += fmt.Sprintf(" = %.2f", r.Fairness)
			} else {
				fair += " (starved)"
			}
			w("| %s%s | %s | %s | %s | %s | %s | %.0f%% | %d | %d |\n", r.Library, errCell(r), f0(r.OpsPerS), spread(r), us(r.HandoffP50us), us(r.HandoffP99us), fair, 100*r.SelfReacquire, r.Failures, r.Overlaps)
		}
	}
	w("\nHandoff is measured from a holder starting its release to the acquire of another (waiting) worker returning. ")
	w("A worker that takes the lock again straight after releasing it (barging) makes no handoff: it is counted under \"same worker again\", and the waiters' clock keeps running from the first release until one of them gets the lock, so handoff is what waiters pay for a lock that has become free. ")
	w("Failed acquires are attempts that gave up inside the run (redsync's default gives up after 32 tries; the worker then tries again). ")
	w("Chart: `handoff.svg`.\n")

	w("\n## (d) %s watchdog-held locks in one process for %s\n\n", m.Params["locks"], m.Params["hold_duration"])
	w("| library | how it is held | CPU s in window | Redis commands/s | of which script calls/s | RSS MiB | goroutines | threads | acquire all (s) | lost during |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range rep.rows(wHold) {
		g := "-"
		if r.Goroutines > 0 {
			g = fmt.Sprint(r.Goroutines)
		}
		w("| %s%s | %s | %.2f | %.0f | %.0f | %.0f | %s | %d | %.2f | %d |\n", r.Library, errCell(r), r.Descriptor, r.CPUSeconds, r.RedisCmdsPS, r.RedisScriptsPS, mib(r.RSSBytes), g, r.Threads, r.AcquireSecs, r.LostDuring)
	}
	w("\nCPU is the process's utime+stime over the window (/proc/PID/stat), Redis commands/s is the INFO stats total_commands_processed delta over the window (it counts the commands a Lua script runs as well as the script call), script calls/s the EVAL+EVALSHA calls (INFO commandstats; calls, not round trips, since a client may pipeline them); RSS and threads from /proc/PID/status at the end of the window. Each library runs in a fresh process; the window starts 5 s after the last lock was taken.\n")

	w("\n## (e) Lost-lock detection (key deleted behind the holder's back, TTL %s, bound %s x 3)\n\n", m.Params["lost_watchdog"], m.Params["lost_watchdog"])
	w("| library | how the holder learns | detected / trials | p50 | max |\n|---|---|---:|---:|---:|\n")
	for _, r := range rep.rows(wLost) {
		p50, mx := "never (within bound)", "-"
		if r.Detected > 0 {
			p50, mx = fmt.Sprintf("%.0f ms", r.DetectP50), fmt.Sprintf("%.0f ms", r.DetectMax)
		}
		mech := r.Mechanism
		if r.Note != "" {
			mech += "; " + r.Note
		}
		w("| %s%s | %s | %d / %d | %s | %s |\n", r.Library, errCell(r), mech, r.Detected, r.Trials, p50, mx)
	}

	w("\n## Targets\n\n")
	for _, t := range rep.targets() {
		w("- %s\n", t)
	}
	return b.String()
}

// targets checks the targets against the figures.
func (rep *report) targets() []string {
	var out []string
	verdict := func(ok bool) string {
		if ok {
			return "**met**"
		}
		return "**missed**"
	}
	ours := func(wl string) *Result { return rep.find(ourName, wl) }
	if ours(wUncontended) == nil {
		return []string{"our Locker was not measured: no target can be checked"}
	}
	if o, f := ours(wUncontended), rep.find("raw floor", wUncontended); f != nil {
		out = append(out, fmt.Sprintf("acquire+release at >= 0.9x the raw floor: %.0f vs %.0f pairs/s = %.2fx: %s", o.OpsPerS, f.OpsPerS, o.OpsPerS/f.OpsPerS, verdict(o.OpsPerS >= 0.9*f.OpsPerS)))
	}
	for _, peer := range []string{"redsync (default)", "redsync (1 ms retry)", "bsm/redislock"} {
		if o, p := ours(wUncontended), rep.find(peer, wUncontended); p != nil {
			out = append(out, fmt.Sprintf("acquire+release ahead of %s: %.0f vs %.0f pairs/s: %s", peer, o.OpsPerS, p.OpsPerS, verdict(o.OpsPerS > p.OpsPerS)))
		}
	}
	for _, wl := range []string{wContended4, wContended32} {
		o := ours(wl)
		if o == nil {
			continue
		}
		out = append(out, fmt.Sprintf("handoff p50 under 1 ms (%s): %s: %s", wl, us(o.HandoffP50us), verdict(o.HandoffP50us > 0 && o.HandoffP50us < 1000)))
		if p := rep.find("redsync (default)", wl); p != nil {
			out = append(out, fmt.Sprintf("handoff p50 at least 10x lower than redsync default (%s): %s vs %s = %.0fx: %s", wl, us(o.HandoffP50us), us(p.HandoffP50us), p.HandoffP50us/o.HandoffP50us, verdict(o.HandoffP50us*10 <= p.HandoffP50us)))
		}
	}
	for _, wl := range []string{wContended4, wContended32} {
		if o := rep.find(ourPerWorkerName, wl); o != nil {
			out = append(out, fmt.Sprintf("handoff p50 under 1 ms with a Locker per worker, as separate replicas (%s): %s: %s", wl, us(o.HandoffP50us), verdict(o.HandoffP50us > 0 && o.HandoffP50us < 1000)))
		}
	}
	// At least Redisson's figure on every workload.
	type cmp struct {
		wl     string
		what   string
		get    func(*Result) float64
		higher bool
	}
	for _, c := range []cmp{
		{wUncontended, "pairs/s", func(r *Result) float64 { return r.OpsPerS }, true},
		{wUncontended, "p99 µs", func(r *Result) float64 { return r.P99us }, false},
		{wDistinct, "pairs/s", func(r *Result) float64 { return r.OpsPerS }, true},
		{wContended4, "acquisitions/s", func(r *Result) float64 { return r.OpsPerS }, true},
		{wContended4, "handoff p50 µs", func(r *Result) float64 { return r.HandoffP50us }, false},
		{wContended32, "acquisitions/s", func(r *Result) float64 { return r.OpsPerS }, true},
		{wContended32, "handoff p50 µs", func(r *Result) float64 { return r.HandoffP50us }, false},
		{wHold, "CPU s", func(r *Result) float64 { return r.CPUSeconds }, false},
		{wHold, "Redis commands/s", func(r *Result) float64 { return r.RedisCmdsPS }, false},
		{wHold, "RSS MiB", func(r *Result) float64 { return mib(r.RSSBytes) }, false},
	} {
		o, p := ours(c.wl), rep.find(redissonName, c.wl)
		if o == nil || p == nil {
			continue
		}
		ov, pv := c.get(o), c.get(p)
		ok := ov >= pv
		if !c.higher {
			ok = ov <= pv
		}
		out = append(out, fmt.Sprintf("at least Redisson's figure, %s %s: %.1f vs %.1f: %s", c.wl, c.what, ov, pv, verdict(ok)))
	}
	if o, p := ours(wLost), rep.find(redissonName, wLost); o != nil && p != nil {
		ok := o.Detected > 0 && (p.Detected == 0 || o.DetectMax <= p.DetectMax)
		out = append(out, fmt.Sprintf("at least Redisson's figure, lost-lock detection: ours %d/%d (max %.0f ms) vs Redisson %d/%d: %s", o.Detected, o.Trials, o.DetectMax, p.Detected, p.Trials, verdict(ok)))
	}
	if o, p := ours(wHold), rep.find(redissonName, wHold); o != nil && p != nil {
		out = append(out, fmt.Sprintf("10,000 held locks for less CPU than Redisson: %.2f vs %.2f CPU s: %s", o.CPUSeconds, p.CPUSeconds, verdict(o.CPUSeconds < p.CPUSeconds)))
	}
	return out
}

// svg draws handoff latency p50 (dark) and p99 (light) per library and
// worker count, on a log scale.
func (rep *report) svg() string {
	type bar struct {
		label    string
		p50, p99 float64
	}
	var bars []bar
	for _, name := range reportOrder {
		for _, wl := range []string{wContended4, wContended32} {
			if r := rep.find(name, wl); r != nil && r.HandoffP50us > 0 {
				n := 4
				if wl == wContended32 {
					n = 32
				}
				bars = append(bars, bar{fmt.Sprintf("%s, %d workers", name, n), r.HandoffP50us, r.HandoffP99us})
			}
		}
	}
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, b := range bars {
		lo = min(lo, b.p50)
		hi = max(hi, b.p99, b.p50)
	}
	if len(bars) == 0 {
		lo, hi = 10, 1e6
	}
	dLo, dHi := math.Floor(math.Log10(lo)), math.Ceil(math.Log10(hi))
	if dHi <= dLo {
		dHi = dLo + 1
	}
	const (
		left, right, top, rowH, barH = 330.0, 130.0, 60.0, 26.0, 16.0
		width                        = 1010.0
	)
	plotW := width - left - right
	height := top + rowH*float64(len(bars)) + 50
	x := func(v float64) float64 {
		return left + (math.Log10(max(v, math.Pow(10, dLo)))-dLo)/(dHi-dLo)*plotW
	}
	var s strings.Builder
	w := func(format string, a ...any) { fmt.Fprintf(&s, format, a...) }
	w(`<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	w(`<rect width="100%%" height="100%%" fill="white"/>` + "\n")
	w(`<text x="%.0f" y="22" font-size="15" font-weight="bold">Lock handoff latency (release to a waiting worker's acquire), %s hold, log scale</text>`+"\n", 20.0, html.EscapeString(rep.Meta.Params["hold_work"]))
	w(`<rect x="%.0f" y="32" width="14" height="10" fill="#1f5fa8"/><text x="%.0f" y="41">p50</text>`+"\n", left, left+18)
	w(`<rect x="%.0f" y="32" width="14" height="10" fill="#9cc3ea"/><text x="%.0f" y="41">p99</text>`+"\n", left+60, left+78)
	for d := dLo; d <= dHi; d++ {
		gx := x(math.Pow(10, d))
		w(`<line x1="%.1f" y1="%.0f" x2="%.1f" y2="%.0f" stroke="#ddd"/>`+"\n", gx, top-6, gx, top+rowH*float64(len(bars)))
		w(`<text x="%.1f" y="%.0f" text-anchor="middle" fill="#555">%s</text>`+"\n", gx, top+rowH*float64(len(bars))+16, decade(d))
	}
	for i, b := range bars {
		y := top + rowH*float64(i)
		w(`<text x="%.0f" y="%.1f" text-anchor="end">%s</text>`+"\n", left-8, y+barH-3, html.EscapeString(b.label))
		w(`<rect x="%.0f" y="%.1f" width="%.1f" height="%.0f" fill="#9cc3ea"/>`+"\n", left, y, max(x(b.p99)-left, 1), barH)
		w(`<rect x="%.0f" y="%.1f" width="%.1f" height="%.0f" fill="#1f5fa8"/>`+"\n", left, y+3, max(x(b.p50)-left, 1), barH-6)
		w(`<text x="%.1f" y="%.1f" fill="#333">%s / %s</text>`+"\n", x(b.p99)+4, y+barH-3, html.EscapeString(us(b.p50)), html.EscapeString(us(b.p99)))
	}
	w(`<text x="%.0f" y="%.0f" fill="#555">handoff latency</text>`+"\n", left+plotW/2-45, top+rowH*float64(len(bars))+34)
	w("</svg>\n")
	return s.String()
}
