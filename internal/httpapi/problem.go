package httpapi

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// Error codes carried in the `code` member of every problem document.
// LOCK_ACQUISITION_FAILED is ADR-024's (docs/adr/024-distributed-lock-strategy.md);
// the others are this API's (docs/contract.md).
const (
	CodeLockAcquisitionFailed = "LOCK_ACQUISITION_FAILED"
	CodeBadInput              = "BAD_INPUT"
	CodeUnauthorized          = "UNAUTHORIZED"
	CodeForbidden             = "FORBIDDEN"
	CodeNotFound              = "NOT_FOUND"
	CodeMethodNotAllowed      = "METHOD_NOT_ALLOWED"
	CodePayloadTooLarge       = "PAYLOAD_TOO_LARGE"
	CodeUnsupportedMediaType  = "UNSUPPORTED_MEDIA_TYPE"
	CodeShuttingDown          = "SHUTTING_DOWN"
	CodeTooManyRuns           = "TOO_MANY_RUNS"
	CodeNotReady              = "NOT_READY"
	CodeOwnershipLost         = "OWNERSHIP_LOST"
	CodeRunFailed             = "RUN_FAILED"
	CodeBackendUnavailable    = "BACKEND_UNAVAILABLE"
	CodeInternal              = "INTERNAL"
)

// ProblemContentType is RFC 9457's media type.
const ProblemContentType = "application/problem+json"

// problemTypeBase prefixes the `type` URI of every problem: a stable,
// dereferenceable-looking name per code (RFC 9457 allows non-resolvable URIs).
const problemTypeBase = "urn:telco-platform:coordinator:problem:"

// Problem is an RFC 9457 problem document plus ADR-024's members (docs/contract.md): code,
// reason, lockKey and owner where they apply.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	// Instance is the request path.
	Instance string `json:"instance,omitempty"`

	Code      string `json:"code"`
	Reason    string `json:"reason,omitempty"`
	LockKey   string `json:"lockKey,omitempty"`
	Owner     string `json:"owner,omitempty"`
	RequestID string `json:"requestId,omitempty"`
	// Checks are readiness's failing conditions (name -> a fixed reason).
	Checks map[string]string `json:"checks,omitempty"`
	// Fields name the values a rejected trigger was refused for (a bill
	// run's period and billing zone).
	Fields map[string]string `json:"fields,omitempty"`
	// Retryable says the same request may succeed later (after
	// Retry-After): true on every 429 and 503, whose cause is transient (a
	// dependency down, the replica at its cap or shutting down); nothing
	// was accepted, so the caller must send it again.
	Retryable bool `json:"retryable,omitempty"`
}

func newProblem(status int, code, detail string) Problem {
	return Problem{
		Type:   problemTypeBase + code,
		Title:  http.StatusText(status),
		Status: status,
		Detail: detail,
		Code:   code,
	}
}

// writeProblem writes p with its status. retryAfter > 0 adds a Retry-After
// header in seconds (429 at capacity; 503 unavailable, shutting down).
func writeProblem(w http.ResponseWriter, r *http.Request, p Problem, retryAfter int) {
	if p.Instance == "" && r != nil {
		p.Instance = r.URL.Path
	}
	if p.RequestID == "" && r != nil {
		p.RequestID = requestIDFrom(r.Context())
	}
	if p.Status == http.StatusServiceUnavailable || p.Status == http.StatusTooManyRequests {
		p.Retryable = true
	}
	h := w.Header()
	h.Set("Content-Type", ProblemContentType)
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	if retryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(retryAfter))
	}
	if p.Status == http.StatusUnauthorized {
		h.Set("WWW-Authenticate", `Bearer realm="coordinator"`)
	}
	w.WriteHeader(p.Status)
	_ = json.NewEncoder(w).Encode(p)
}

// writeJSON writes v as application/json with status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
