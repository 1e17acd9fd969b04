package server

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestBeyondLoopbackServesOnlyUpstreamsPaths: on an admin listener beyond
// loopback every client gets what upstream's admin port serves,
// /healthcheck and /json, and 404 for every other page, naming the loopback
// admin listener; a loopback client too, since a mesh sidecar (Istio's
// 127.0.0.6) forwards other pods' requests from loopback.
func TestBeyondLoopbackServesOnlyUpstreamsPaths(t *testing.T) {
	_, a, _ := newAdmin(t)
	h := a.BeyondLoopback("127.0.0.1:8082")
	for _, tc := range []struct {
		method, path, remote string
		served               bool
	}{
		{"GET", "/healthcheck", "10.1.2.3:50000", true},
		{"POST", "/json", "10.1.2.3:50000", true},
		{"GET", "/", "10.1.2.3:50000", false},
		{"GET", "/rlconfig", "10.1.2.3:50000", false},
		{"GET", "/rlconfig/admitted", "[fd00::7]:50000", false},
		{"GET", "/metrics", "10.1.2.3:50000", false},
		{"GET", "/debug/pprof/", "10.1.2.3:50000", false},
		{"GET", "/debug/pprof/cmdline", "10.1.2.3:50000", false},
		{"GET", "/status.css", "10.1.2.3:50000", false},
		{"GET", "/debug/pprof/cmdline", "127.0.0.1:50000", false},
		{"GET", "/debug/pprof/cmdline", "127.0.0.6:40000", false},
		{"GET", "/rlconfig", "[::1]:50000", false},
		{"GET", "/rlconfig", "[::ffff:127.0.0.1]:50000", false},
		{"GET", "/healthcheck", "127.0.0.6:40000", true},
		{"GET", "/metrics", "not-an-address", false},
	} {
		req := httptest.NewRequest(tc.method, tc.path, strings.NewReader(`{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}`))
		req.RemoteAddr = tc.remote
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if served := rec.Code != http.StatusNotFound; served != tc.served {
			t.Errorf("%s %s from %s: %d, want served=%v\n%s", tc.method, tc.path, tc.remote, rec.Code, tc.served, rec.Body)
		}
		if !tc.served && !strings.Contains(rec.Body.String(), "only /healthcheck and /json") || !tc.served && !strings.Contains(rec.Body.String(), "127.0.0.1:8082") {
			t.Errorf("%s %s from %s: the 404 does not say why: %q", tc.method, tc.path, tc.remote, rec.Body)
		}
	}
}
