package membership

// A counting reverse proxy in front of a real agent: it changes nothing in
// what passes through, and records what the agent served, so tests can see
// the query parameters the watch sends and the cache headers the agent
// answers with, and the cost measurement can count requests and bytes.

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// served is one health query as the agent answered it.
type served struct {
	query  url.Values
	status int
	xCache string // the X-Cache header: "HIT", "MISS" or "" (none)
	// encoding is the Content-Encoding: the proxy passes the client's
	// Accept-Encoding on, so bytes are what crossed the wire.
	encoding string
	bytes    int64 // response body bytes
}

func (s served) cached() bool { return s.query.Has("cached") }

// agentProxy forwards everything to one agent and records its answers to
// /v1/health/service/.
type agentProxy struct {
	srv *httptest.Server

	mu     sync.Mutex
	health []served
}

func newAgentProxy(t testing.TB, agentAddr string) *agentProxy {
	t.Helper()
	p := &agentProxy{}
	target := &url.URL{Scheme: "http", Host: agentAddr}
	rp := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) { r.SetURL(target) },
		// No pooled connections, so none outlives the test (goleak).
		Transport: countingTransport{p: p, next: &http.Transport{DisableKeepAlives: true}},
		// A client that gives up on a blocking query is not an error here.
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) { w.WriteHeader(http.StatusBadGateway) },
	}
	p.srv = httptest.NewServer(rp)
	t.Cleanup(p.srv.Close)
	return p
}

func (p *agentProxy) addr() string { return strings.TrimPrefix(p.srv.URL, "http://") }

// served returns the health queries answered so far, in the order their
// answers ended.
func (p *agentProxy) served() []served {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]served(nil), p.health...)
}

type countingTransport struct {
	p    *agentProxy
	next http.RoundTripper
}

func (ct countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := ct.next.RoundTrip(r)
	if err != nil || !strings.HasPrefix(r.URL.Path, "/v1/health/service/") {
		return resp, err
	}
	s := served{query: r.URL.Query(), status: resp.StatusCode, xCache: resp.Header.Get("X-Cache"),
		encoding: resp.Header.Get("Content-Encoding")}
	resp.Body = &countingBody{ReadCloser: resp.Body, done: func(n int64) {
		s.bytes = n
		ct.p.mu.Lock()
		ct.p.health = append(ct.p.health, s)
		ct.p.mu.Unlock()
	}}
	return resp, nil
}

// countingBody counts the bytes read through it and reports them once, on
// Close.
type countingBody struct {
	io.ReadCloser
	n    int64
	once sync.Once
	done func(int64)
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	atomic.AddInt64(&b.n, int64(n))
	return n, err
}

func (b *countingBody) Close() error {
	err := b.ReadCloser.Close()
	b.once.Do(func() { b.done(atomic.LoadInt64(&b.n)) })
	return err
}
