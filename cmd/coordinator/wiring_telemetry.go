package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"

	"go.opentelemetry.io/otel"

	"github.com/telco-platform/coordinator/internal/config"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/telemetry"
)

// revision is set at build time with -ldflags "-X main.revision=..."; empty,
// the build info's vcs.revision is used, else "unknown".
var revision = ""

// vcsRevision is the commit the binary was built from, for
// coordinator_build_info.
func vcsRevision() string {
	if revision != "" {
		return revision
	}
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, s := range info.Settings {
			if s.Key == "vcs.revision" {
				return s.Value
			}
		}
	}
	return "unknown"
}

// setupTelemetry starts tracing as the OTEL_* variables say (off when
// unset). A value it cannot use is printed naming the variable and the
// returned code is 64. shutdown flushes what is buffered, bounded.
func setupTelemetry(ctx context.Context, cio cliIO, name string, cfg config.Config, log *slog.Logger) (tel *telemetry.Provider, shutdown func(), code int) {
	tel, err := telemetry.Setup(ctx, cio.getenv, telemetry.Info{Version: versionString(), InstanceID: cfg.ReplicaID})
	if err != nil {
		var ee *telemetry.EnvError
		if errors.As(err, &ee) {
			fmt.Fprintf(cio.stderr, "coordinator %s: %v\n", name, err)
			return nil, nil, job.ExitUsage
		}
		fmt.Fprintf(cio.stderr, "coordinator %s: tracing: %v\n", name, err)
		return nil, nil, job.ExitFailed
	}
	if tel.Enabled() {
		// The SDK reports export failures through the global handler.
		otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { log.Warn("otel_error", "error", err) }))
	}
	return tel, func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), telemetry.ShutdownTimeout)
		defer cancel()
		if err := tel.Shutdown(sctx); err != nil {
			log.Warn("tracing_flush_incomplete", "error", err)
		}
	}, 0
}
