package httpapi_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/billrun"
	"github.com/telco-platform/coordinator/internal/httpapi"
	"github.com/telco-platform/coordinator/internal/job"
)

// seedBodies is the corpus every fuzz target starts from; it runs in the
// normal suite (go test), the fuzzer explores from it (go test -fuzz=...).
var seedBodies = []string{
	`{"period":"2026-11"}`,
	`{"period":"2026-11","request_id":"r-1","requested_by":"ops"}`,
	`{"request_id":"r-1"}`,
	``,
	` `,
	`{}`,
	`null`,
	`[]`,
	`"2026-11"`,
	`{"period":2026}`,
	`{"period":null}`,
	`{"period":"2026-13"}`,
	`{"period":"1999-12"}`,
	`{"period":"2026-1"}`,
	`{"period":"2026-11","extra":1}`,
	`{"period":"2026-11"}{"period":"2026-12"}`,
	`{"period":"2026-11"`,
	`{"period":"\u0000"}`,
	`{"period":"2026-11","request_id":"a b"}`,
	`{"period":"2026-11","PERIOD":"2026-12"}`,
	`{"period":"2026-11","period":"2026-12"}`,
	"\xff\xfe{}",
	`{"period":"` + strings.Repeat("9", 100) + `"}`,
	`{"requested_by":{"x":1}}`,
}

func checkDecoded(t *testing.T, what string, err error) {
	t.Helper()
	if err == nil {
		return
	}
	require.True(t, errors.Is(err, job.ErrBadInput), "%s: error %v must wrap job.ErrBadInput", what, err)
	require.Greater(t, len(err.Error()), len(job.ErrBadInput.Error())+2, "%s: error must give a reason", what)
}

// FuzzDecodeRunRequest decodes every body for each registered kind: a
// valid request or bad input with a reason, never anything else.
func FuzzDecodeRunRequest(f *testing.F) {
	for _, s := range seedBodies {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, k := range testKinds(t).Kinds() {
			req, err := httpapi.DecodeRunRequest(k, body)
			checkDecoded(t, k.Spec().Name, err)
			if err != nil {
				require.Zero(t, req)
				continue
			}
			require.NotEmpty(t, k.LockKey(req.Params), "the kind's own params")
			for _, v := range []string{req.RequestID, req.RequestedBy} {
				require.LessOrEqual(t, len(v), 128)
				require.False(t, strings.ContainsAny(v, " \t\r\n\x00"), "accepted %q", v)
			}
			if k.Spec().Name == billrun.JobName {
				_, id, _ := strings.Cut(k.LockKey(req.Params), ":")
				p, err := billrun.ParsePeriod(id)
				require.NoError(t, err)
				require.True(t, p.Valid(), "accepted period %v", p)
			}
		}
	})
}

// FuzzPostBillRun drives whole requests through the handler: every answer
// is 202 or a problem document; a 4xx always names a reason.
func FuzzPostBillRun(f *testing.F) {
	for _, s := range seedBodies {
		f.Add([]byte(s), "application/json")
	}
	f.Add([]byte(`{"period":"2026-11"}`), "")
	f.Add([]byte(`{"period":"2026-11"}`), "text/plain")
	f.Add([]byte(`{"period":"2026-11"}`), "application/json; charset=utf-8")
	f.Add([]byte(`{"period":"2026-11"}`), ";;;")
	f.Fuzz(func(t *testing.T, body []byte, contentType string) {
		b := setup(t, nil)
		for _, path := range []string{"/v1/billruns", "/v1/msisdn-reaper/sweeps"} {
			req := httptest.NewRequest("POST", path, strings.NewReader(string(body)))
			req.Header.Set("Authorization", "Bearer "+token)
			if contentType != "" {
				req.Header.Set("Content-Type", contentType)
			}
			w := httptest.NewRecorder()
			b.api.ServeHTTP(w, req)
			switch w.Code {
			case http.StatusAccepted, http.StatusOK:
				continue
			case http.StatusBadRequest, http.StatusUnsupportedMediaType, http.StatusRequestEntityTooLarge,
				http.StatusUnprocessableEntity: // a period that is not closed
			default:
				t.Fatalf("%s %q (%q): unexpected status %d: %s", path, body, contentType, w.Code, w.Body)
			}
			require.Equal(t, httpapi.ProblemContentType, w.Header().Get("Content-Type"))
			var p httpapi.Problem
			require.NoError(t, json.Unmarshal(w.Body.Bytes(), &p))
			require.Equal(t, w.Code, p.Status)
			require.NotEmpty(t, p.Code)
			require.NotEmpty(t, p.Detail, "a rejection names its reason")
		}
	})
}
