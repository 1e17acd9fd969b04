package daemon

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sharelimit/sharelimit/config"
	"github.com/sharelimit/sharelimit/descriptors"
	"github.com/sharelimit/sharelimit/server"
	"github.com/sharelimit/sharelimit/source/xds"
)

// xdsRules sets up the xDS rules source (--config-type GRPC_XDS_SOTW): every
// update the management server pushes is compiled like files and installed
// through rules; a bad one is NACKed and the rules in force stay. Its state
// shows on /rlconfig, the status page and the metrics.
func (d *Daemon) xdsRules(rules *installer, reg prometheus.Registerer) error {
	cfg := d.cfg
	md, err := config.ParseKeyValues(cfg.XDSNodeMetadata)
	if err != nil {
		return fmt.Errorf("--xds-node-metadata: %w", err)
	}
	headers, err := config.ParseKeyValues(cfg.XDSHeaders)
	if err != nil {
		return fmt.Errorf("--xds-headers: %w", err)
	}
	var tlsConfig *tls.Config
	if cfg.XDSTLS {
		if tlsConfig, err = xdsTLS(cfg); err != nil {
			return err
		}
	}
	d.xds, err = xds.New(xds.Config{
		ServerURL: cfg.XDSServerURL, NodeID: cfg.XDSNodeID, NodeMetadata: md, Headers: headers,
		TLS: tlsConfig, MaxMessageBytes: cfg.XDSMaxMsgSize,
		Backoff: xds.Backoff{Initial: cfg.XDSBackoffInitial, Max: cfg.XDSBackoffMax, Jitter: cfg.XDSBackoffJitter},
		Apply:   rules.install, Compile: descriptors.CompileOptions{MergeDomains: cfg.MergeDomainConfig},
		Log: d.log.With("component", "xds"),
	})
	if err != nil {
		return err
	}
	rules.source = func() server.SourceStatus { return sourceStatus(d.xds.Status()) }
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sharelimit_config_xds_connected",
			Help: "1 while a stream to the xDS management server is open."}, func() float64 {
			if d.xds.Status().Connected {
				return 1
			}
			return 0
		}),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sharelimit_config_xds_nacks_total",
			Help: "xDS updates refused (NACKed); the rules in force stayed."}, func() float64 { return float64(d.xds.Status().Nacks) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sharelimit_config_xds_last_nack_timestamp_seconds",
			Help: "When the last xDS update was refused; 0 if none was."}, func() float64 {
			if at := d.xds.Status().LastNack.At; !at.IsZero() {
				return float64(at.UnixNano()) / 1e9
			}
			return 0
		}),
	)
	return nil
}

// sourceStatus is the xDS state as the admin pages show it.
func sourceStatus(st xds.Status) server.SourceStatus {
	out := server.SourceStatus{Kind: "xds", Location: st.Server, Connected: st.Connected, ConnectedSince: st.ConnectedSince,
		Version: st.Version, LastError: st.LastError, Updates: st.Updates, Nacks: st.Nacks}
	if st.LastNack.Version != "" || st.LastNack.Error != "" {
		out.LastNack = &server.Nack{Version: st.LastNack.Version, Error: st.LastNack.Error, At: st.LastNack.At}
	}
	return out
}

// xdsTLS is the client TLS of the xDS connection: the system's roots or
// --xds-tls-ca, a client certificate when given, and the server name
// --xds-tls-san, else the host of --xds-server-url.
func xdsTLS(cfg *config.Config) (*tls.Config, error) {
	t := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: cfg.XDSTLSSAN}
	if t.ServerName == "" {
		if host, _, err := net.SplitHostPort(cfg.XDSServerURL); err == nil {
			t.ServerName = host
		}
	}
	if cfg.XDSTLSCA != "" {
		pem, err := os.ReadFile(cfg.XDSTLSCA)
		if err != nil {
			return nil, fmt.Errorf("--xds-tls-ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--xds-tls-ca %s: no PEM certificates", cfg.XDSTLSCA)
		}
		t.RootCAs = pool
	}
	if cfg.XDSTLSCert != "" || cfg.XDSTLSKey != "" {
		cert, err := tls.LoadX509KeyPair(cfg.XDSTLSCert, cfg.XDSTLSKey)
		if err != nil {
			return nil, fmt.Errorf("--xds-tls-cert/--xds-tls-key: %w", err)
		}
		t.Certificates = []tls.Certificate{cert}
	}
	return t, nil
}
