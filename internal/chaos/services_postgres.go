package chaos

// The verifier's throwaway PostgreSQL cluster.

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/telco-platform/coordinator/internal/localsvc"
)

// --------------------------------------------------------------- Postgres

// pgServer is a throwaway PostgreSQL cluster: initdb once, then the postgres
// binary as a direct child (as the postgres OS user when we are root,
// because PostgreSQL refuses to run as root).
type pgServer struct {
	bin  string
	dir  string
	data string
	logs string
	port int

	mu   sync.Mutex
	proc *proc
}

func (s *pgServer) dsn() string { return localsvc.PostgresDSN(s.port) }

func startPostgres(ctx context.Context, bin, dir, logDir string) (*pgServer, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	s := &pgServer{bin: bin, dir: dir, logs: filepath.Join(logDir, "postgres.log"), port: port}
	if s.data, err = localsvc.InitPostgres(ctx, bin, dir); err != nil {
		return nil, err
	}
	return s, s.start(ctx)
}

func (s *pgServer) start(ctx context.Context) error {
	cmd, err := localsvc.PostgresCommand(s.bin, s.data, s.port,
		// fsync off only risks an OS crash. synchronous_commit keeps its
		// default (on): a crash (immediate shutdown) then loses nothing
		// acknowledged, except during the postgres-lost-commits fault, which
		// turns it off with ALTER SYSTEM (so it is not set here: a command
		// line setting would win over ALTER SYSTEM).
		"max_connections=300", "shared_buffers=128MB", "log_min_messages=warning",
		"log_line_prefix=%m [%p] ",
		// Commit times of rows (pg_xact_commit_timestamp): the order in
		// which batches really committed, not when their rows were written.
		"track_commit_timestamp=on")
	if err != nil {
		return err
	}
	// SIGQUIT is the postmaster's immediate shutdown: it dies with us.
	p, err := startProc("postgres", cmd, procOptions{logPath: s.logs, deathSig: syscall.SIGQUIT})
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.proc = p
	s.mu.Unlock()
	if !waitFor(ctx, 60*time.Second, 100*time.Millisecond, func() bool {
		if p.exited() {
			return true
		}
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		c, err := pgx.Connect(cctx, s.dsn())
		if err != nil {
			return false
		}
		c.Close(cctx)
		return true
	}) || p.exited() {
		return fmt.Errorf("postgres did not start on 127.0.0.1:%d: %s", s.port, strings.Join(p.tailLines(5), " | "))
	}
	return nil
}

// halt stops the postmaster: SIGINT is a fast shutdown, SIGQUIT an immediate
// one (crash recovery at the next start).
func (s *pgServer) halt(sig syscall.Signal) {
	s.mu.Lock()
	p := s.proc
	s.mu.Unlock()
	if p != nil {
		p.stop(sig, 30*time.Second)
	}
}
