// Command chaos is the coordinator's fault-injection verifier (issue 14):
// `make chaos` runs it. It starts its own Redis (master, replica,
// sentinel), PostgreSQL and Kafka on free loopback ports, runs several
// `coordinator serve` replicas and `coordinator lock` workers against them,
// injects faults drawn from a seed, lets the system recover, checks the
// recorded history and writes $CHAOS_OUT/report.json and report.md.
//
// Environment:
//
//	CHAOS_DURATION    fault phase in seconds (default 120)
//	CHAOS_SEED        seed of the fault schedule and workload (default random; printed first)
//	CHAOS_OUT         report directory (default chaos-out)
//	CHAOS_SABOTAGE    1: run against the chaos_sabotage build, which must be caught
//	CHAOS_FAULTS      comma-separated fault kinds (default all)
//	CHAOS_RECOVERY    bound of the quiet recovery phase in seconds (default 90)
//	CHAOS_COORDINATOR the coordinator binary (default bin/coordinator-chaos, the -tags testhooks build; bin/coordinator-sabotage)
//	CHAOS_KAFKA_LIBS  the Kafka jars (default: found under .cache/kafka, see scripts/services)
//
// Exit: 0 no anomaly, 1 anomalies found, 2 the run could not be carried out, 64 bad usage.
//
// `chaos check DIR` runs the checks again over DIR/history.json. `chaos
// critical` and `chaos linger` are the critical-section helper the lock
// workers run under `coordinator lock` (not for direct use).
package main

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/telco-platform/coordinator/internal/chaos"
)

func main() {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "critical":
			os.Exit(chaos.Critical(os.Args[2:]))
		case "linger":
			os.Exit(chaos.Linger())
		case "check":
			os.Exit(recheck(os.Args[2:]))
		case "-h", "--help", "help":
			fmt.Println(usage)
			os.Exit(0)
		default:
			fmt.Fprintf(os.Stderr, "chaos: unknown argument %q\n%s\n", os.Args[1], usage)
			os.Exit(64)
		}
	}
	os.Exit(run())
}

const usage = `usage: chaos (configured by the environment; see make chaos)
  CHAOS_DURATION=120 CHAOS_SEED=<random> CHAOS_OUT=chaos-out CHAOS_SABOTAGE=0
  CHAOS_FAULTS=<all> CHAOS_RECOVERY=90 CHAOS_COORDINATOR=bin/coordinator-chaos CHAOS_KAFKA_LIBS=<.cache/kafka/*/libs>
exit: 0 no anomaly, 1 anomalies, 2 the run could not be carried out, 64 bad usage`

func run() int {
	cfg, err := config()
	if errors.Is(err, chaos.ErrMissing) {
		fmt.Fprintf(os.Stderr, "chaos: %v\n", err)
		return 2
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "chaos: %v\n%s\n", err, usage)
		return 64
	}
	fmt.Printf("chaos: seed %d (replay: CHAOS_SEED=%d)\n", cfg.Seed, cfg.Seed)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	start := time.Now()
	res, err := chaos.Run(ctx, cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "chaos: %v\n", err)
		return 2
	}
	rep := res.Report
	fmt.Printf("chaos: seed %d, %s fault phase, %d faults, verdict %s (%s in all)\n", rep.Seed, cfg.Duration,
		sum(rep.Faults), rep.Verdict, time.Since(start).Round(time.Second))
	if rep.Verdict != chaos.VerdictOK {
		n := map[string]int{}
		var kinds []string
		for _, a := range res.Anomalies {
			if n[a.Kind] == 0 {
				kinds = append(kinds, a.Kind)
			}
			n[a.Kind]++
		}
		for _, k := range kinds {
			fmt.Printf("chaos:   %-28s %d\n", k, n[k])
		}
	}
	fmt.Printf("chaos: report: %s, %s\n", filepath.Join(cfg.Out, "report.md"), filepath.Join(cfg.Out, "report.json"))
	if rep.Verdict != chaos.VerdictOK {
		return 1
	}
	return 0
}

// recheck runs the checks again over a report directory's history.json
// and prints the anomalies: exit 0 none, 1 some, 2 unreadable.
func recheck(args []string) int {
	if len(args) != 1 {
		fmt.Fprintln(os.Stderr, "usage: chaos check CHAOS_OUT_DIR")
		return 64
	}
	h, err := chaos.LoadHistory(args[0])
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos check:", err)
		return 2
	}
	as := chaos.Check(h)
	for _, a := range as {
		fmt.Printf("%s\t%s\n", a.Kind, a.Detail)
	}
	fmt.Printf("chaos check: %d anomalies\n", len(as))
	if len(as) > 0 {
		return 1
	}
	return 0
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

func config() (chaos.Config, error) {
	var cfg chaos.Config
	secs := func(name string, def int) (time.Duration, error) {
		v := os.Getenv(name)
		if v == "" {
			return time.Duration(def) * time.Second, nil
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return 0, fmt.Errorf("%s = %q: want a whole number of seconds, at least 1", name, v)
		}
		return time.Duration(n) * time.Second, nil
	}
	var err error
	if cfg.Duration, err = secs("CHAOS_DURATION", 120); err != nil {
		return cfg, err
	}
	if cfg.Recovery, err = secs("CHAOS_RECOVERY", 90); err != nil {
		return cfg, err
	}
	if v := os.Getenv("CHAOS_SEED"); v != "" {
		if cfg.Seed, err = strconv.ParseUint(v, 10, 64); err != nil {
			return cfg, fmt.Errorf("CHAOS_SEED = %q: want an unsigned integer", v)
		}
	} else {
		var b [8]byte
		_, _ = rand.Read(b[:])
		cfg.Seed = binary.LittleEndian.Uint64(b[:]) % 1_000_000_000
	}
	cfg.Out = os.Getenv("CHAOS_OUT")
	if cfg.Out == "" {
		cfg.Out = "chaos-out"
	}
	switch v := strings.ToLower(os.Getenv("CHAOS_SABOTAGE")); v {
	case "", "0", "false", "no":
	case "1", "true", "yes":
		cfg.Sabotage = true
	default:
		return cfg, fmt.Errorf("CHAOS_SABOTAGE = %q: want 1 or 0", v)
	}
	if cfg.Faults, err = chaos.ParseFaultKinds(os.Getenv("CHAOS_FAULTS")); err != nil {
		return cfg, fmt.Errorf("CHAOS_FAULTS: %v", err)
	}
	wd, _ := os.Getwd()
	root := chaos.RepoRoot(wd)
	coord := os.Getenv("CHAOS_COORDINATOR")
	if coord == "" {
		coord = filepath.Join(root, "bin", "coordinator-chaos")
		if cfg.Sabotage {
			coord = filepath.Join(root, "bin", "coordinator-sabotage")
		}
	}
	self, err := os.Executable()
	if err != nil {
		return cfg, err
	}
	cfg.Binaries, err = chaos.FindBinaries(chaos.Binaries{Coordinator: coord, Helper: self, KafkaLibs: os.Getenv("CHAOS_KAFKA_LIBS")}, root)
	if err != nil {
		return cfg, err
	}
	if err := chaos.CheckBuild(coord, cfg.Sabotage); err != nil {
		return cfg, err
	}
	if err := os.MkdirAll(cfg.Out, 0o755); err != nil {
		return cfg, err
	}
	return cfg, nil
}
