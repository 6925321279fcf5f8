package telemetry

import (
	"net/http"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/trace"
)

// HTTPHandler traces the requests h serves with otelhttp: a server span per
// request, child of the request's traceparent, named by the method until
// the handler renames it by route (NameHTTPSpan). Off, h only gets the
// request's W3C traceparent header, if any, as the remote parent of its
// context.
func (p *Provider) HTTPHandler(h http.Handler) http.Handler {
	if !p.Enabled() {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("traceparent") != "" {
				r = r.WithContext(Off().Extract(r.Context(), HeaderCarrier(r.Header.Get)))
			}
			h.ServeHTTP(w, r)
		})
	}
	return otelhttp.NewHandler(h, "http", otelhttp.WithTracerProvider(p.tp), otelhttp.WithPropagators(p.prop),
		otelhttp.WithSpanNameFormatter(func(_ string, r *http.Request) string { return r.Method }))
}

// NameHTTPSpan renames the request's server span to "METHOD route" once the
// route is known (r.Pattern, "POST /v1/billruns").
func NameHTTPSpan(r *http.Request, route string) {
	if span := trace.SpanFromContext(r.Context()); span.IsRecording() {
		span.SetName(route)
	}
}
