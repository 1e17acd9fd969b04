package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestValidateEveryError holds the whole of Validate's report, in order, for
// settings wrong in every way at once: one with the rules from files, one
// from xDS, so that each branch reports. The files' paths are given as
// <dir>.
func TestValidateEveryError(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing.pem")
	files := Defaults()
	*files = Config{
		GRPCTransport: "http3", GRPCAddr: "10.0.0.1:99999", HTTPAddr: "localhost:8080", DebugAddr: "unix:/tmp/x",
		LocalHTTPAddr: "10.0.0.2:8082", MetricsAddr: "127.0.0.1:8080", MetricsPath: "metrics", NearLimitRatio: 1.5,
		GRPCTLSCert: missing, GRPCTLSClientSAN: "client", ConfigType: "FILE", ConfigDir: missing,
		XDSServerURL: "elsewhere:1", XDSNodeID: "default", XDSHeaders: "a:b", XDSTLS: true, XDSBackoffInitial: time.Second,
		XDSBackoffMax: time.Minute, XDSBackoffJitter: 0.5, Replicas: 0, ConsulFilter: "x", Node: "n",
		DomainServices: []DomainService{{Domain: "a", Service: ""}}, ConsulQueryRate: 0, ConsulWait: time.Hour,
		MembershipHold: -1, ShareMode: "both", DemandInterval: time.Hour, DemandMaxWrites: 0, DemandTopKeys: -1,
		DemandPrefix: "/x", PeersDNSServer: "dns:53", PeersDNSInterval: time.Second, MaxBuckets: 0, SweepInterval: 0,
		RLQSTTL: 1500 * time.Millisecond, RLQSAbandonAfter: time.Second,
		ReloadDebounce: -1, Drain: -1, StateMaxAge: 0, StateInterval: time.Millisecond, JoinRamp: -5,
		HeaderLimit: "Rate Limit", HeaderRemaining: "", HeaderReset: "RateLimit-Reset", LogFormat: "xml", LogLevel: "loud",
	}
	xds := Defaults()
	xds.ConfigType, xds.ConfigDir = ConfigXDS, ""
	xds.GRPCAddr, xds.HTTPAddr = "unix:", "0.0.0.0:8081"
	xds.XDSServerURL, xds.XDSNodeID, xds.XDSNodeMetadata, xds.XDSHeaders = "", "", "k", "A:1,a:2,b c:3,x:\x01"
	xds.XDSTLSCA, xds.XDSTLSSAN = missing, "san"
	xds.XDSBackoffInitial, xds.XDSBackoffMax, xds.XDSBackoffJitter, xds.XDSMaxMsgSize = time.Second, time.Millisecond, 2, -1
	xds.PeersDNS, xds.ConsulService, xds.ShareMode = "bad name", "svc", ShareDemand
	var b strings.Builder
	for _, c := range []*Config{files, xds} {
		err := c.Validate()
		if err == nil {
			t.Fatalf("%+v: valid", c)
		}
		b.WriteString(strings.ReplaceAll(err.Error(), dir, "<dir>") + "\n\n")
	}
	const golden = "testdata/validate_every_error.golden"
	if *update {
		if err := os.WriteFile(golden, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if b.String() != string(want) {
		t.Errorf("Validate's report differs from %s (-update rewrites it):\n%s", golden, b.String())
	}
}
