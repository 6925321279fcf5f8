package httpapi

import (
	"bytes"
	"context"
	"net/http"

	"github.com/telco-platform/coordinator/internal/events"
)

// Trigger answers a POST of body to path (a kind's HTTP path) as the API
// would answer a caller authenticated as principal with the mutate scope:
// the same decoding, cap on runs in flight, draining, dispatch and
// answers (202, 409 already owned naming the owner, 429, 503, ...). The
// console's action goes through it, so its answer is the API's. The caller
// has checked the principal's mutate scope. No such path: 404.
func (a *API) Trigger(ctx context.Context, principal, path string, body []byte) (status int, contentType string, answer []byte) {
	for _, k := range a.cfg.Kinds.Kinds() {
		if k.Spec().HTTPPath != path {
			continue
		}
		r, err := http.NewRequestWithContext(ctx, http.MethodPost, path, bytes.NewReader(body))
		if err != nil {
			return http.StatusInternalServerError, "text/plain", []byte(err.Error())
		}
		r.Header.Set("Content-Type", "application/json")
		id := requestIDFrom(ctx)
		if id == "" {
			id = events.NewID()
		}
		r = r.WithContext(context.WithValue(context.WithValue(ctx, requestIDKey, id), principalKey, principal))
		rec := &recorder{header: http.Header{}}
		a.postRun(k)(rec, r)
		if rec.status == 0 {
			rec.status = http.StatusOK
		}
		return rec.status, rec.header.Get("Content-Type"), rec.body.Bytes()
	}
	return http.StatusNotFound, "text/plain", []byte("no kind has the path " + path)
}

// recorder is an in-memory http.ResponseWriter.
type recorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.header }
func (r *recorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
}
func (r *recorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.body.Write(b)
}
