// Package otlptest is an in-process OTLP trace receiver for tests and
// benchmarks: OTLP/HTTP protobuf (POST /v1/traces, gzip or not) and OTLP
// gRPC on loopback, decoding what the exporters send into Spans.
package otlptest

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/hex"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// Span is one received span, flattened.
type Span struct {
	TraceID, SpanID, ParentID string // hex; ParentID empty for a root
	Name                      string
	Kind                      tracepb.Span_SpanKind
	Scope                     string // instrumentation scope name
	Service                   string // resource service.name
	Attrs                     map[string]any
	Resource                  map[string]any
	StatusError               bool
	Events                    []string
	Links                     []string // linked span ids
	Start, End                time.Time
}

// Receiver collects the spans exported to it. Safe for concurrent use.
type Receiver struct {
	http *httptest.Server
	grpc *grpc.Server
	gln  net.Listener

	mu       sync.Mutex
	spans    []Span
	count    int
	discard  bool
	requests int
	changed  chan struct{}
}

// Start serves OTLP/HTTP and OTLP/gRPC on loopback until the test ends.
func Start(t testing.TB) *Receiver {
	t.Helper()
	r := &Receiver{changed: make(chan struct{})}
	r.http = httptest.NewServer(http.HandlerFunc(r.serveHTTP))
	t.Cleanup(r.http.Close)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("otlptest: listen: %v", err)
	}
	r.gln = ln
	r.grpc = grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(r.grpc, traceService{r: r})
	go func() { _ = r.grpc.Serve(ln) }()
	t.Cleanup(r.grpc.Stop)
	return r
}

// Discard makes the receiver read and drop what it gets without decoding
// it (benchmarks: the decoding is a collector's cost, not the exporter's);
// Requests still counts, Count no longer does.
func (r *Receiver) Discard() {
	r.mu.Lock()
	r.discard = true
	r.spans = nil
	r.mu.Unlock()
}

// HTTPEndpoint is the OTEL_EXPORTER_OTLP_ENDPOINT of the HTTP receiver.
func (r *Receiver) HTTPEndpoint() string { return r.http.URL }

// GRPCEndpoint is the OTEL_EXPORTER_OTLP_ENDPOINT of the gRPC receiver
// (plaintext: OTEL_EXPORTER_OTLP_INSECURE=true).
func (r *Receiver) GRPCEndpoint() string { return "http://" + r.gln.Addr().String() }

// Spans returns what was received so far.
func (r *Receiver) Spans() []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Span(nil), r.spans...)
}

// Count is how many spans were received, kept or not.
func (r *Receiver) Count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.count
}

// Requests is how many export requests arrived.
func (r *Receiver) Requests() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.requests
}

// WaitFor waits until cond holds for the spans received, or within passes
// (then the test fails with what arrived).
func (r *Receiver) WaitFor(t testing.TB, within time.Duration, what string, cond func([]Span) bool) []Span {
	t.Helper()
	deadline := time.NewTimer(within)
	defer deadline.Stop()
	for {
		r.mu.Lock()
		spans, ch := append([]Span(nil), r.spans...), r.changed
		r.mu.Unlock()
		if cond(spans) {
			return spans
		}
		select {
		case <-ch:
		case <-deadline.C:
			names := make([]string, 0, len(spans))
			for _, s := range spans {
				names = append(names, s.Name)
			}
			t.Fatalf("otlptest: %s: not within %s; %d spans received: %v", what, within, len(spans), names)
		}
	}
}

func (r *Receiver) serveHTTP(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodPost || req.URL.Path != "/v1/traces" {
		http.Error(w, "only POST /v1/traces", http.StatusNotFound)
		return
	}
	var body io.Reader = req.Body
	if req.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(req.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = zr
	}
	b, err := io.ReadAll(body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.mu.Lock()
	discard := r.discard
	if discard {
		r.requests++
	}
	r.mu.Unlock()
	if discard {
		w.Header().Set("Content-Type", "application/x-protobuf")
		return
	}
	var msg coltracepb.ExportTraceServiceRequest
	if err := proto.Unmarshal(b, &msg); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.add(&msg)
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = io.Copy(w, bytes.NewReader(out))
}

type traceService struct {
	coltracepb.UnimplementedTraceServiceServer
	r *Receiver
}

func (s traceService) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	s.r.add(req)
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

func (r *Receiver) add(req *coltracepb.ExportTraceServiceRequest) {
	var got []Span
	n := 0
	for _, rs := range req.GetResourceSpans() {
		res := attrs(rs.GetResource().GetAttributes())
		service, _ := res["service.name"].(string)
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				n++
				s := Span{
					TraceID: hex.EncodeToString(sp.GetTraceId()), SpanID: hex.EncodeToString(sp.GetSpanId()),
					Name: sp.GetName(), Kind: sp.GetKind(), Scope: ss.GetScope().GetName(), Service: service,
					Attrs: attrs(sp.GetAttributes()), Resource: res,
					StatusError: sp.GetStatus().GetCode() == tracepb.Status_STATUS_CODE_ERROR,
					Start:       time.Unix(0, int64(sp.GetStartTimeUnixNano())), End: time.Unix(0, int64(sp.GetEndTimeUnixNano())),
				}
				if p := sp.GetParentSpanId(); len(p) > 0 {
					s.ParentID = hex.EncodeToString(p)
				}
				for _, e := range sp.GetEvents() {
					s.Events = append(s.Events, e.GetName())
				}
				for _, l := range sp.GetLinks() {
					s.Links = append(s.Links, hex.EncodeToString(l.GetSpanId()))
				}
				got = append(got, s)
			}
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.requests++
	r.count += n
	if !r.discard {
		r.spans = append(r.spans, got...)
	}
	close(r.changed)
	r.changed = make(chan struct{})
}

func attrs(kvs []*commonpb.KeyValue) map[string]any {
	out := make(map[string]any, len(kvs))
	for _, kv := range kvs {
		v := kv.GetValue()
		switch x := v.GetValue().(type) {
		case *commonpb.AnyValue_StringValue:
			out[kv.GetKey()] = x.StringValue
		case *commonpb.AnyValue_IntValue:
			out[kv.GetKey()] = x.IntValue
		case *commonpb.AnyValue_BoolValue:
			out[kv.GetKey()] = x.BoolValue
		case *commonpb.AnyValue_DoubleValue:
			out[kv.GetKey()] = x.DoubleValue
		default:
			out[kv.GetKey()] = v.String()
		}
	}
	return out
}

// Named returns the spans called name.
func Named(spans []Span, name string) []Span {
	var out []Span
	for _, s := range spans {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

// ByID indexes spans by span id.
func ByID(spans []Span) map[string]Span {
	out := make(map[string]Span, len(spans))
	for _, s := range spans {
		out[s.SpanID] = s
	}
	return out
}
