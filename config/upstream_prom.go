package config

import (
	"fmt"
	"net"
	"strconv"
	"strings"
)

// Upstream's Prometheus sink (USE_PROMETHEUS): the metrics listener, where
// upstream served its statsd_exporter mapping, and the settings of the
// series it maps.

// upstreamPromAddr is upstream's PROMETHEUS_ADDR default: every interface.
const upstreamPromAddr = ":9090"

var (
	// convListenAddr wants host:port, the host optional (:9090).
	convListenAddr = func(v string) (string, error) {
		_, port, err := net.SplitHostPort(v)
		if err == nil {
			_, err = strconv.ParseUint(port, 10, 16)
		}
		if err != nil {
			return "", fmt.Errorf("want host:port or :port, got %q", v)
		}
		return v, nil
	}
	convPath = func(v string) (string, error) {
		if !strings.HasPrefix(v, "/") {
			return "", fmt.Errorf("want a path starting with /, got %q", v)
		}
		return v, nil
	}
	convRatio = func(v string) (string, error) {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || !(f >= 0 && f <= 1) {
			return "", fmt.Errorf("want a ratio between 0 and 1, got %q", v)
		}
		return strconv.FormatFloat(f, 'g', -1, 64), nil
	}
)

// prometheus applies USE_PROMETHEUS=true once the table's rows have: the
// metrics listener at upstream's default address, unless PROMETHEUS_ADDR (a
// gated row) or a flag or SHARELIMIT_* variable named one.
func (u *upstreamEnv) prometheus() {
	const name = "USE_PROMETHEUS"
	switch {
	case !u.on(name):
		// false, upstream's default, is not worth a line: the rows it
		// closes are reported as ignored.
	case u.given["metrics-addr"]:
		u.mark(outcome{kind: overridden}, name)
	case u.val("PROMETHEUS_ADDR") != "":
		u.mark(outcome{kind: applied}, name)
	default:
		u.set("metrics-addr", upstreamPromAddr, name)
	}
}
