package telemetry_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/trace"

	"github.com/telco-platform/coordinator/internal/telemetry"
	"github.com/telco-platform/coordinator/internal/telemetry/otlptest"
)

func envOf(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestTracingIsOffUnlessTheEnvironmentAsksForIt(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		env  map[string]string
		want bool
	}{
		{map[string]string{}, false},
		{map[string]string{"OTEL_SERVICE_NAME": "x", "OTEL_TRACES_SAMPLER": "always_on"}, false},
		{map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, false},
		{map[string]string{"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, false},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, true},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, true},
		{map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, true},
		{map[string]string{"OTEL_TRACES_EXPORTER": "console"}, true},
	} {
		require.Equalf(t, tc.want, telemetry.Wanted(envOf(tc.env)), "%v", tc.env)
	}
	p, err := telemetry.Setup(context.Background(), envOf(map[string]string{}), telemetry.Info{})
	require.NoError(t, err)
	require.False(t, p.Enabled())
	require.Equal(t, "off", p.Exporter())
	require.Nil(t, p.PgxTracer(), "off: pgx runs without a tracer")
	require.Nil(t, p.Kafka("g").Opts(), "off: no kotel hooks")
	_, span := p.Tracer("x").Start(context.Background(), "s")
	require.False(t, span.IsRecording())
}

// setEnv sets the OTEL_* variables the SDK reads from the process
// environment, and returns them for Setup's getenv.
func setEnv(t *testing.T, kv map[string]string) func(string) string {
	for k, v := range kv {
		t.Setenv(k, v)
	}
	return envOf(kv)
}

func TestSetupExportsOverHTTPAndGRPC(t *testing.T) {
	for _, proto := range []string{"http/protobuf", "grpc"} {
		t.Run(proto, func(t *testing.T) {
			rcv := otlptest.Start(t)
			endpoint := rcv.HTTPEndpoint()
			if proto == "grpc" {
				endpoint = rcv.GRPCEndpoint()
			}
			getenv := setEnv(t, map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": proto,
				"OTEL_EXPORTER_OTLP_INSECURE": "true", "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment.name=test"})
			p, err := telemetry.Setup(context.Background(), getenv, telemetry.Info{Version: "v9", InstanceID: "replica-1"})
			require.NoError(t, err)
			require.True(t, p.Enabled())
			require.Equal(t, "otlp "+proto, p.Exporter())
			_, span := p.Tracer("test").Start(context.Background(), "hello")
			span.End()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			require.NoError(t, p.Shutdown(ctx))
			got := otlptest.Named(rcv.Spans(), "hello")
			require.Len(t, got, 1)
			require.Equal(t, "coordinator", got[0].Service)
			require.Equal(t, "v9", got[0].Resource["service.version"])
			require.Equal(t, "replica-1", got[0].Resource["service.instance.id"])
			require.Equal(t, "test", got[0].Resource["deployment.environment.name"])
			require.NoError(t, p.Shutdown(ctx), "twice")
		})
	}
}

func TestSamplerComesFromTheEnvironment(t *testing.T) {
	rcv := otlptest.Start(t)
	getenv := setEnv(t, map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": rcv.HTTPEndpoint(), "OTEL_TRACES_SAMPLER": "traceidratio",
		"OTEL_TRACES_SAMPLER_ARG": "0"})
	p, err := telemetry.Setup(context.Background(), getenv, telemetry.Info{})
	require.NoError(t, err)
	_, span := p.Tracer("test").Start(context.Background(), "never")
	require.False(t, span.IsRecording(), "ratio 0 samples nothing")
	span.End()
	require.NoError(t, p.Shutdown(context.Background()))
	require.Zero(t, rcv.Count())
}

func TestSetupNamesTheVariableItCannotUse(t *testing.T) {
	for _, tc := range []struct {
		env      map[string]string
		variable string
	}{
		{map[string]string{"OTEL_TRACES_EXPORTER": "zipkin-ish"}, "OTEL_TRACES_EXPORTER"},
		{map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "carrier-pigeon"}, "OTEL_EXPORTER_OTLP_PROTOCOL"},
		{map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_TRACES_SAMPLER": "sometimes"}, "OTEL_TRACES_SAMPLER"},
		{map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "2"}, "OTEL_TRACES_SAMPLER_ARG"},
		{map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_PROPAGATORS": "tracecontext,smoke-signals"}, "OTEL_PROPAGATORS"},
	} {
		_, err := telemetry.Setup(context.Background(), setEnv(t, tc.env), telemetry.Info{})
		var ee *telemetry.EnvError
		require.Truef(t, errors.As(err, &ee), "%v: %v", tc.env, err)
		require.Equal(t, tc.variable, ee.Variable)
		require.Contains(t, err.Error(), tc.variable)
		for k := range tc.env {
			t.Setenv(k, "")
		}
	}
}

const parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

func TestOffStillHandsOnTheTriggersTraceContext(t *testing.T) {
	t.Parallel()
	off := telemetry.Off()
	rec := &kgo.Record{Topic: "t", Headers: []kgo.RecordHeader{{Key: "traceparent", Value: []byte(parent)}}}
	ctx, span := off.Kafka("g").Process(context.Background(), rec)
	require.False(t, span.IsRecording())
	span.End()
	tp, _ := telemetry.TraceParent(trace.SpanContextFromContext(ctx))
	require.Equal(t, parent, tp)

	ctx, _ = off.Kafka("g").Process(context.Background(), &kgo.Record{Topic: "t"})
	require.False(t, trace.SpanContextFromContext(ctx).IsValid(), "no header, no trace context")

	var seen string
	h := off.HTTPHandler(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		seen, _ = telemetry.TraceParent(trace.SpanContextFromContext(r.Context()))
	}))
	req := httptest.NewRequest(http.MethodPost, "/v1/billruns", nil)
	req.Header.Set("traceparent", parent)
	h.ServeHTTP(httptest.NewRecorder(), req)
	require.Equal(t, parent, seen)
}
