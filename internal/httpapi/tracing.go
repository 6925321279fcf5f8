package httpapi

import (
	"net/http"
	"strings"

	"github.com/telco-platform/coordinator/internal/telemetry"
)

// nameSpan names the request's server span (otelhttp's, when tracing is
// on) by its route: "POST /v1/billruns", "GET /v1/billruns/{id}".
func nameSpan(r *http.Request, route string) {
	if !strings.Contains(route, " ") {
		route = r.Method + " " + route
	}
	telemetry.NameHTTPSpan(r, route)
}
