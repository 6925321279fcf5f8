package telemetry

import (
	"fmt"

	"github.com/exaring/otelpgx"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/extra/redisotel/v9"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/metric/noop"
)

// PgxTracer traces pgx with otelpgx (a span per query, batch, copy and
// connect; SQL text without parameters); nil when tracing is off, so that
// pgx runs untraced.
func (p *Provider) PgxTracer() pgx.QueryTracer {
	if !p.Enabled() {
		return nil
	}
	// Span names are the SQL's first words (otelpgx's default).
	return otelpgx.NewTracer(otelpgx.WithTracerProvider(p.tp), otelpgx.WithMeterProvider(noop.NewMeterProvider()))
}

// InstrumentRedis traces client's commands with redisotel (a span per
// command or pipeline, without the arguments: lock scripts carry owner
// tokens; without the caller's code location, which walks the stack on
// every command, sampled or not, and would always name the lock adapter);
// it does nothing when tracing is off.
func (p *Provider) InstrumentRedis(client redis.UniversalClient) error {
	if !p.Enabled() {
		return nil
	}
	if err := redisotel.InstrumentTracing(client, redisotel.WithTracerProvider(p.tp), redisotel.WithDBStatement(false),
		redisotel.WithCallerEnabled(false)); err != nil {
		return fmt.Errorf("telemetry: instrument redis: %w", err)
	}
	return nil
}
