package httpapi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"
)

// Server timeouts: slow clients cannot hold connections open (slowloris),
// while a synchronous sweep still has time to answer.
const (
	ReadHeaderTimeout = 5 * time.Second
	ReadTimeout       = 15 * time.Second
	WriteTimeout      = 3 * time.Minute
	IdleTimeout       = 2 * time.Minute
	MaxHeaderBytes    = 16 << 10
)

// Server is the admin listener with Start/Stop.
type Server struct {
	srv  *http.Server
	log  *slog.Logger
	addr string

	mu       sync.Mutex
	ln       net.Listener
	done     chan struct{}
	stopOnce sync.Once
	serveErr error
}

// NewServer returns a Server for h on addr (":8080", "127.0.0.1:0").
func NewServer(addr string, h http.Handler, log *slog.Logger) *Server {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Server{
		addr: addr,
		log:  log,
		srv: &http.Server{
			Handler:           h,
			ReadHeaderTimeout: ReadHeaderTimeout,
			ReadTimeout:       ReadTimeout,
			WriteTimeout:      WriteTimeout,
			IdleTimeout:       IdleTimeout,
			MaxHeaderBytes:    MaxHeaderBytes,
			ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		},
		done: make(chan struct{}),
	}
}

// Start listens and serves in the background. It returns once the listener
// is bound, so Addr is known (useful with port 0).
func (s *Server) Start(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln != nil {
		return errors.New("httpapi: server already started")
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", s.addr)
	if err != nil {
		return fmt.Errorf("httpapi: listen on %s: %w", s.addr, err)
	}
	s.ln = ln
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("http_serve_failed", "addr", ln.Addr().String(), "error", err)
			s.mu.Lock()
			s.serveErr = err
			s.mu.Unlock()
		}
	}()
	return nil
}

// Addr is the bound address (nil before Start).
func (s *Server) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln == nil {
		return nil
	}
	return s.ln.Addr()
}

// Stop stops accepting connections and waits for in-flight requests until
// ctx ends, then closes what is left. Safe twice; a no-op before Start.
func (s *Server) Stop(ctx context.Context) error {
	var err error
	s.stopOnce.Do(func() {
		s.mu.Lock()
		started := s.ln != nil
		s.mu.Unlock()
		if !started {
			return
		}
		if err = s.srv.Shutdown(ctx); err != nil {
			err = errors.Join(err, s.srv.Close())
		}
		<-s.done
		s.mu.Lock()
		err = errors.Join(err, s.serveErr)
		s.mu.Unlock()
	})
	return err
}
