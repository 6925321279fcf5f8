// Package telemetry is the coordinator's OpenTelemetry tracing, set up
// from the standard OTEL_* environment variables, and the Prometheus
// collectors that watch its client libraries (build info, the pgx pool, the
// go-redis pool, franz-go clients through kprom).
//
// # On and off
//
// Tracing is off unless the environment asks for it: OTEL_TRACES_EXPORTER
// set to an exporter other than "none", or an OTLP endpoint
// (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT).
// OTEL_SDK_DISABLED=true turns it off whatever else is set. Off costs
// nothing measurable: no SDK, no exporter, no plugin hook is installed, and
// the template's spans are not even started. One thing still happens when
// off, because it is nearly free and operators rely on it: a W3C
// traceparent that arrives with a trigger (Kafka record header, HTTP
// header) is read and handed on, so the CloudEvents that report the run
// carry it.
//
// On, the exporter is go.opentelemetry.io/contrib/exporters/autoexport's:
// OTLP over HTTP/protobuf (default) or gRPC by OTEL_EXPORTER_OTLP_PROTOCOL
// (or ..._TRACES_PROTOCOL), with the OTLP exporters' own variables
// (endpoint, headers, TLS, timeout, compression), or "console". Sampling is
// the SDK's OTEL_TRACES_SAMPLER / OTEL_TRACES_SAMPLER_ARG (default
// parentbased_always_on), batching OTEL_BSP_*, propagation OTEL_PROPAGATORS
// (default tracecontext,baggage), resource OTEL_SERVICE_NAME (default
// "coordinator") and OTEL_RESOURCE_ATTRIBUTES. Those are read by the SDK
// from the process environment.
//
// The instrumented clients are franz-go (kotel), go-redis (redisotel), pgx
// (otelpgx) and net/http (otelhttp), each through Provider methods that
// return nothing to install when tracing is off.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.opentelemetry.io/contrib/exporters/autoexport"
	"go.opentelemetry.io/contrib/propagators/autoprop"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// ServiceName is the default service.name (OTEL_SERVICE_NAME overrides it).
const ServiceName = "coordinator"

// Info describes the process in the trace resource.
type Info struct {
	// Version is service.version.
	Version string
	// InstanceID is service.instance.id (the replica id).
	InstanceID string
}

// Provider is the process's tracing: the tracer provider and propagator the
// instrumented code uses. A nil *Provider is tracing off.
type Provider struct {
	on       bool
	tp       trace.TracerProvider
	sdk      *sdktrace.TracerProvider
	prop     propagation.TextMapPropagator
	exporter string
}

// Off is tracing off: a no-op tracer provider; the W3C trace context of a
// trigger is still read and handed on.
func Off() *Provider {
	return &Provider{tp: noop.NewTracerProvider(), prop: propagation.TraceContext{}, exporter: "off"}
}

// EnvError names the OTEL_* variable whose value could not be used.
type EnvError struct {
	Variable, Value string
	Err             error
}

func (e *EnvError) Error() string {
	return fmt.Sprintf("telemetry: %s = %q: %v", e.Variable, e.Value, e.Err)
}

func (e *EnvError) Unwrap() error { return e.Err }

// Wanted reports whether the environment asks for tracing (see the package
// doc), reading it through getenv.
func Wanted(getenv func(string) string) bool {
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true") {
		return false
	}
	switch exp := strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER")); exp {
	case "none":
		return false
	case "":
		return getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
	}
	return true
}

// Setup returns tracing off when Wanted(getenv) is false, and otherwise an
// SDK tracer provider exporting as the OTEL_* variables say. A value the
// SDK cannot use is an *EnvError naming the variable (exit 64). Nothing is
// contacted here: the exporter connects when it first exports.
func Setup(ctx context.Context, getenv func(string) string, info Info) (*Provider, error) {
	if !Wanted(getenv) {
		return Off(), nil
	}
	if err := checkEnv(getenv); err != nil {
		return nil, err
	}
	exp, err := autoexport.NewSpanExporter(ctx)
	if err != nil {
		return nil, envError(getenv, err)
	}
	attrs := []attribute.KeyValue{semconv.ServiceName(ServiceName)}
	if info.Version != "" {
		attrs = append(attrs, semconv.ServiceVersion(info.Version))
	}
	if info.InstanceID != "" {
		attrs = append(attrs, semconv.ServiceInstanceID(info.InstanceID))
	}
	// Later detectors win: the environment overrides the defaults.
	res, err := resource.New(ctx, resource.WithAttributes(attrs...), resource.WithTelemetrySDK(), resource.WithFromEnv())
	if err != nil && res == nil {
		_ = exp.Shutdown(ctx)
		return nil, &EnvError{Variable: "OTEL_RESOURCE_ATTRIBUTES", Value: getenv("OTEL_RESOURCE_ATTRIBUTES"), Err: err}
	}
	prop, err := propagator(getenv("OTEL_PROPAGATORS"))
	if err != nil {
		_ = exp.Shutdown(ctx)
		return nil, &EnvError{Variable: "OTEL_PROPAGATORS", Value: getenv("OTEL_PROPAGATORS"), Err: err}
	}
	// No WithSampler: the SDK reads OTEL_TRACES_SAMPLER(_ARG) itself, and
	// WithBatcher reads OTEL_BSP_*.
	sdk := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	return &Provider{on: true, tp: sdk, sdk: sdk, prop: prop, exporter: describe(getenv)}, nil
}

// propagator is OTEL_PROPAGATORS' list (default tracecontext,baggage).
func propagator(names string) (propagation.TextMapPropagator, error) {
	var list []string
	for _, n := range strings.Split(names, ",") {
		if n = strings.TrimSpace(n); n != "" {
			list = append(list, n)
		}
	}
	if len(list) == 0 {
		return propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}), nil
	}
	return autoprop.TextMapPropagator(list...)
}

// checkEnv refuses values the SDK would silently ignore: an unknown sampler
// falls back to the default without a word.
func checkEnv(getenv func(string) string) error {
	switch s := getenv("OTEL_TRACES_SAMPLER"); s {
	case "", "always_on", "always_off", "traceidratio", "parentbased_always_on", "parentbased_always_off",
		"parentbased_traceidratio":
	default:
		return &EnvError{Variable: "OTEL_TRACES_SAMPLER", Value: s, Err: errors.New("want always_on, always_off, traceidratio, " +
			"parentbased_always_on, parentbased_always_off or parentbased_traceidratio")}
	}
	if s := getenv("OTEL_TRACES_SAMPLER"); strings.HasSuffix(s, "traceidratio") {
		if a := getenv("OTEL_TRACES_SAMPLER_ARG"); a != "" {
			var f float64
			if _, err := fmt.Sscanf(a, "%g", &f); err != nil || f < 0 || f > 1 {
				return &EnvError{Variable: "OTEL_TRACES_SAMPLER_ARG", Value: a, Err: errors.New("want a ratio from 0 to 1")}
			}
		}
	}
	return nil
}

// envError names the variable an autoexport error is about.
func envError(getenv func(string) string, err error) error {
	v := "OTEL_TRACES_EXPORTER"
	if strings.Contains(err.Error(), "protocol") {
		v = "OTEL_EXPORTER_OTLP_PROTOCOL"
		if getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") != "" {
			v = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
		}
	}
	return &EnvError{Variable: v, Value: getenv(v), Err: err}
}

func describe(getenv func(string) string) string {
	exp := getenv("OTEL_TRACES_EXPORTER")
	if exp == "" {
		exp = "otlp"
	}
	if exp != "otlp" {
		return exp
	}
	proto := getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if proto == "" {
		proto = getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	if proto == "" {
		proto = "http/protobuf"
	}
	return "otlp " + proto
}

// Enabled reports whether spans are recorded and exported.
func (p *Provider) Enabled() bool { return p != nil && p.on }

// Exporter says where spans go ("off", "otlp grpc", "console"), for the
// start log line.
func (p *Provider) Exporter() string {
	if p == nil {
		return "off"
	}
	return p.exporter
}

// TracerProvider is the provider to hand to instrumentation: a no-op one
// when tracing is off.
func (p *Provider) TracerProvider() trace.TracerProvider {
	if p == nil {
		return noop.NewTracerProvider()
	}
	return p.tp
}

// Tracer is TracerProvider().Tracer(name).
func (p *Provider) Tracer(name string) trace.Tracer { return p.TracerProvider().Tracer(name) }

// TracerIfOn is Tracer when tracing is on, else nil: for components whose
// nil tracer skips their span bookkeeping (owned.RunnerConfig.Tracer).
func (p *Provider) TracerIfOn(name string) trace.Tracer {
	if !p.Enabled() {
		return nil
	}
	return p.Tracer(name)
}

// Propagator reads and writes trace context in headers: the configured
// propagators when on, W3C trace context alone when off.
func (p *Provider) Propagator() propagation.TextMapPropagator {
	if p == nil {
		return propagation.TraceContext{}
	}
	return p.prop
}

// ShutdownTimeout bounds the final flush of spans.
const ShutdownTimeout = 5 * time.Second

// Shutdown flushes the spans still buffered and stops the exporter, within
// ctx. Safe on tracing off and twice.
func (p *Provider) Shutdown(ctx context.Context) error {
	if p == nil || p.sdk == nil {
		return nil
	}
	return p.sdk.Shutdown(ctx)
}

// ForceFlush exports the spans buffered so far.
func (p *Provider) ForceFlush(ctx context.Context) error {
	if p == nil || p.sdk == nil {
		return nil
	}
	return p.sdk.ForceFlush(ctx)
}

// NewForTest is tracing on with the given span processor and sampler (nil:
// always on), for tests and benchmarks that collect spans in process.
func NewForTest(sp sdktrace.SpanProcessor, sampler sdktrace.Sampler) *Provider {
	if sampler == nil {
		sampler = sdktrace.AlwaysSample()
	}
	sdk := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sp), sdktrace.WithSampler(sampler))
	return &Provider{on: true, tp: sdk, sdk: sdk, prop: propagation.NewCompositeTextMapPropagator(propagation.TraceContext{},
		propagation.Baggage{}), exporter: "test"}
}
